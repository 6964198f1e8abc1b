"""One chaos soak: a real job (ranks of antdt.demo.train with checkpoints and group
restarts; under `antdt launch` on this machine, or with `hosts` under torchrun on
network-namespace hosts) against two replicas of each service and 3-node NATS (R3) and
etcd clusters, while the seeded schedule's faults are injected at their times; then the
invariants. Bounded: the job is sized to outlast the schedule, and the soak stops it
after `deadline_s` whatever happens."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from antdt.agent.samplelog import exactly_once_problems, read_sample_logs
from antdt.observe import ensure_recording
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import ServiceSettings
from antdt.schemas import ACTION_STREAM, ActionRecord, Incident, Subjects
from antdt.testing import cores
from antdt.testing.faults import FaultKind, FaultRecord, FaultState, advance, due, schedule
from antdt.testing.hostbed import HostBed
from tests.chaos.checks import (
    actions_applied_twice,
    open_incidents_without_reason,
    with_responses,
)
from tests.chaos.inject import Injector, targets
from tests.chaos.jobs import HostJob, Job, LocalJob
from tests.chaos.stack import MARK, Replicas, leftovers
from tests.clusters import Clusters, retry, running_clusters

WORLD, BATCH, SHARD, EPOCHS, MIN_STEP_S = 2, 64, 32, 2, 0.1
#: Each namespace host's CPU budget, CPUs (the machine has 2 cores).
HOST_CPUS = 0.8
#: The prefix of the soak's namespaces (what the leftover check looks for).
BED_PREFIX = "chaos"


@dataclass
class Soak:
    """What a soak recorded, and the problems its invariants found."""

    seed: int
    records: list[FaultRecord]
    steps: list[tuple[float, int]]  # (seconds from the start, step) of rank 0
    rc: int = -1
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    actions: list[ActionRecord] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)


def job_env(
    settings: ServiceSettings, job: str, out: Path, dataset: int, mark: str
) -> dict[str, str]:
    return dict(
        os.environ,
        ANTDT_NATS__URL=settings.nats.url,
        ANTDT_NATS__SUBJECT_PREFIX=settings.nats.subject_prefix,
        ANTDT_JOB=job,
        ANTDT_POLICY="lb-bsp",
        ANTDT_DATASET_SIZE=str(dataset),
        ANTDT_SHARD_SIZE=str(SHARD),
        ANTDT_GLOBAL_BATCH=str(BATCH),
        ANTDT_EPOCHS=str(EPOCHS),
        ANTDT_SEED="11",
        ANTDT_SAMPLE_LOG=str(out / "samples"),
        ANTDT_DEMO_OUT=str(out),
        ANTDT_DEMO_WIDTH="32",
        ANTDT_DEMO_CKPT_DIR=str(out),
        ANTDT_DEMO_CKPT_EVERY="10",
        ANTDT_DEMO_MIN_STEP_S=str(MIN_STEP_S),
        ANTDT_TELEMETRY__LOG_FORMAT="json",
        **{MARK: mark},
    )


def dataset_for(seconds: float) -> int:
    """A dataset whose EPOCHS take about `seconds` at MIN_STEP_S a step."""
    steps = int(seconds / MIN_STEP_S / EPOCHS) + 1
    return -(-steps * BATCH // SHARD) * SHARD


def run_soak(
    seed: int, count: int, root: Path, *, every_s: float = 15.0, hosts: bool = False
) -> Soak:
    """One soak of `count` faults, about `every_s` apart, under `root`; the invariants'
    problems in its `problems` (the leftover check runs once the clusters are down).
    `hosts`: the ranks on namespace hosts under torchrun, links cut among the faults;
    the clusters, services and this driver on a control host of the same bed."""
    unique = "c" + uuid.uuid4().hex[:8]
    (root / "logs").mkdir(parents=True, exist_ok=True)
    if hosts:
        soak, bed = _on_hosts(seed, count, root, every_s, unique)
        soak.problems += [f"namespace left: {n}" for n in bed.remains()]
    else:
        with running_clusters(root / "servers") as clusters:
            job = LocalJob(WORLD, cores()[:2], root / "logs")
            soak = asyncio.run(_soak(seed, count, root, every_s, clusters, unique, job))
    soak.problems += [f"left behind: {p}" for p in leftovers(unique, root)]
    return soak


def _on_hosts(
    seed: int, count: int, root: Path, every_s: float, unique: str
) -> tuple[Soak, HostBed]:
    """The soak on a bed (closed when this returns, however it ends): a control host
    with the clusters, the replicas and this driver; WORLD rank hosts."""
    with HostBed(prefix=BED_PREFIX) as bed:
        control = bed.add_host("ctl")
        workers = [bed.add_host(f"w{i}", cpus=HOST_CPUS) for i in range(WORLD)]
        with running_clusters(root / "servers", control.address, control.netns) as clusters:
            job = HostJob(bed, workers, root / "logs")
            run = _soak(seed, count, root, every_s, clusters, unique, job)
            soak = bed.call(control, lambda: asyncio.run(run))
    return soak, bed


async def _soak(
    seed: int,
    count: int,
    root: Path,
    every_s: float,
    clusters: Clusters,
    unique: str,
    job: Job,
) -> Soak:
    settings = ServiceSettings(
        nats=clusters.nats_settings(f"antdt.{unique}"),
        etcd=clusters.etcd_settings(f"/antdt-chaos/{unique}/", lease_ttl_s=2),
        replica_id=f"driver-{unique}",
    )
    name, out, subjects = f"chaos-{unique}", root / "job", Subjects(settings.nats.subject_prefix)
    out.mkdir(parents=True, exist_ok=True)
    bus = await Bus(settings.nats, name="chaos-driver").connect(retry_for_s=20)
    await retry(lambda: ensure_recording(bus, subjects, settings.recording), pause=0.2)
    live: list[ActionRecord] = []
    incidents: list[Incident] = []

    async def on_action(record: ActionRecord, _: Delivery) -> None:
        live.append(record)

    async def on_incident(incident: Incident, _: Delivery) -> None:
        incidents.append(incident)

    await bus.subscribe(subjects.action(name), ActionRecord, on_action)
    await bus.subscribe(subjects.incident(name), Incident, on_incident)
    replicas = Replicas(settings, root / "logs", unique)
    injector = Injector(clusters, replicas, job)
    soak = Soak(seed, [], [])
    try:
        replicas.start_serving(replicas.names)
        breakable = targets(clusters, replicas, job)
        plan = schedule(seed, breakable, count=count, every_s=every_s, leave_out=job.left_out)
        last = max((f.until_s for f in plan), default=0.0)
        dataset = dataset_for(last + 20.0)
        job.start(job_env(settings, name, out, dataset, unique), count + 3)
        soak.records = [FaultRecord(f) for f in plan]
        start_wall = await _first_step(out / "progress.jsonl", job)
        await _run_faults(soak, injector, job, out, start_wall, 3 * last + 180.0)
        soak.rc = job.exit_code()
        soak.problems += [f"replica exited by itself: {r}" for r in replicas.exited()]
        soak.seconds = time.time() - start_wall
        soak.steps = _steps(out / "progress.jsonl", start_wall)
        recorded = await retry(
            lambda: bus.jetstream.read(ACTION_STREAM, subjects.action(name), ActionRecord)
        )
        soak.actions, soak.incidents = list(recorded.items), incidents
        soak.problems += _invariants(soak, live, out, dataset, start_wall)
        soak.records = with_responses(soak.records, incidents, soak.actions, start_wall)
    finally:
        await asyncio.to_thread(injector.undo_all)
        job.stop()
        replicas.stop_all()
        await bus.close()
    return soak


async def _first_step(progress: Path, job: Job) -> float:
    """The Unix time of the job's first step: the soak's clock starts there."""
    for _ in range(1800):
        if progress.exists() and progress.stat().st_size > 0:
            return time.time()
        if not job.running():
            raise RuntimeError(f"the job ended before its first step (exit {job.exit_code()})")
        await asyncio.sleep(0.1)
    raise RuntimeError("no step in 180 s")


def _steps(progress: Path, start_wall: float) -> list[tuple[float, int]]:
    rows = []
    for line in progress.read_text().splitlines() if progress.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        rows.append((float(row["t"]) - start_wall, int(row["step"])))
    return rows


async def _run_faults(
    soak: Soak,
    injector: Injector,
    job: Job,
    out: Path,
    start_wall: float,
    deadline_s: float,
) -> None:
    """Inject each fault when due, undo it after its hold, mark it recovered once the job
    steps again after that (after the group's restart for a killed rank); until the job
    ends or `deadline_s` passes (then the job is stopped: a failed soak)."""
    since, back_from = -1.0, dict[int, float]()
    restarts_at: dict[int, int] = {}
    while job.running():
        now = time.time() - start_wall
        for fault in due([r.fault for r in soak.records], since, now):
            soak.records[fault.number] = _inject(soak.records[fault.number], injector, now)
            restarts_at[fault.number] = job.restarts()
        since = now
        steps = _steps(out / "progress.jsonl", start_wall)
        last_t = steps[-1][0] if steps else 0.0
        for i, record in enumerate(soak.records):
            n = record.fault.number
            if record.state is FaultState.INJECTED and now >= record.fault.until_s:
                note = await asyncio.to_thread(injector.undo, record.fault)
                if note is not None:  # a step counts from when the undo is done
                    record = advance(record, "undone", now, f"{record.note}; {note}")
                    back_from[n] = time.time() - start_wall
            if _group_restarted(record, n not in back_from, restarts_at.get(n), job):
                back_from[n] = now
            if (
                n in back_from
                and record.state is not FaultState.RECOVERED
                and last_t > back_from[n]
            ):
                record = advance(
                    record, "recovered", last_t, f"{record.note}; stepping at {steps[-1][1]}"
                )
            soak.records[i] = record
        if now > deadline_s:
            soak.problems.append(f"the job had not ended after {deadline_s:.0f} s: stopped")
            job.stop()
            break
        await asyncio.sleep(0.25)
    await asyncio.to_thread(injector.undo_all)
    ended = time.time() - start_wall
    for i, record in enumerate(soak.records):
        if record.state is FaultState.PLANNED:
            soak.records[i] = advance(record, "failed", ended, "not injected: the job had ended")
        elif record.state in (FaultState.INJECTED, FaultState.UNDONE):
            soak.records[i] = advance(record, "failed", ended, f"{record.note}; no step after it")


def _group_restarted(record: FaultRecord, waiting: bool, before: int | None, job: Job) -> bool:
    """A killed rank's group was started again since `before` restarts."""
    if record.fault.kind is not FaultKind.KILL_RANK or not waiting or before is None:
        return False
    return record.state is FaultState.INJECTED and job.restarts() > before


def _inject(record: FaultRecord, injector: Injector, now: float) -> FaultRecord:
    try:
        return advance(record, "injected", now, injector.inject(record.fault))
    except (ValueError, OSError) as error:
        return advance(record, "failed", now, f"not injected: {error}")


def _invariants(
    soak: Soak, live: list[ActionRecord], out: Path, dataset: int, start_wall: float
) -> list[str]:
    problems = [] if soak.rc == 0 else [f"the job did not finish: exit {soak.rc}"]
    lines = read_sample_logs(out / "samples", WORLD)
    problems += [f"samples: {p}" for p in exactly_once_problems(lines, dataset, EPOCHS)]
    problems += actions_applied_twice(soak.actions)
    problems += [f"live: {p}" for p in actions_applied_twice(live)]
    problems += open_incidents_without_reason(
        soak.incidents, soak.records, soak.seconds, start_wall
    )
    return problems
