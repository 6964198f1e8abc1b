"""Exactly once across faults (issue #3): a real data-parallel job (torch gloo ranks of
antdt.demo.train) against real nats-server, etcd and services; a fault mid-epoch; then
the sample-id audit over every rank's sample log: in each epoch, the ids that reached the
final model's updates are exactly the dataset, each once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from antdt.agent.samplelog import exactly_once_problems, read_sample_logs
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import EtcdSettings, NatsSettings, ServiceSettings
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store
from antdt.schemas import FetchStatus, JobHealth, Keys, RankState, StepEvent, Subjects
from tests.e2e.conftest import start_services
from tests.helpers import wait_for
from tests.integration.agent_fixtures import ShardsTap
from tests.secured import agent_env

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.integration]

WORLD, DATASET, SHARD, BATCH, EPOCHS = 3, 2400, 40, 96, 2


def job_env(settings: ServiceSettings, job: str, out: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        **agent_env(settings, job),
        ANTDT_JOB=job,
        ANTDT_DATASET_SIZE=str(DATASET),
        ANTDT_SHARD_SIZE=str(SHARD),
        ANTDT_GLOBAL_BATCH=str(BATCH),
        ANTDT_EPOCHS=str(EPOCHS),
        ANTDT_SEED="5",
        ANTDT_SAMPLE_LOG=str(out / "samples"),
        ANTDT_DEMO_OUT=str(out),
        ANTDT_DEMO_WIDTH="32",
        ANTDT_TELEMETRY__LOG_FORMAT="json",
        **extra,
    )
    return env


async def run_job(env: dict[str, str], *, max_restarts: int = 0) -> int:
    from antdt.agent.launch import launch

    command = [sys.executable, "-m", "antdt.demo.train"]
    return await asyncio.to_thread(launch, WORLD, command, env=env, max_restarts=max_restarts)


def audit(out: Path) -> list[dict[str, Any]]:
    lines = read_sample_logs(out / "samples", WORLD)
    assert exactly_once_problems(lines, DATASET, EPOCHS) == []
    return lines


def restores(lines: list[dict[str, Any]]) -> set[tuple[int, int | None]]:
    return {(ln["incarnation"], ln["restored"]) for ln in lines if "restored" in ln}


# ------------------------------------------------- a rank dies; the job restarts


@pytest.mark.parametrize(
    ("how", "fail_step"),
    [("kill", 27), ("exit", 45)],
    ids=["rank-killed-9-job-restarted-from-checkpoint", "rank-restarted-in-place"],
)
async def test_a_failed_rank_and_a_restart_from_the_checkpoint_lose_and_repeat_nothing(
    settings: ServiceSettings, tmp_path: Path, unique: str, how: str, fail_step: int
) -> None:
    """kill: SIGKILL mid-epoch, holding prefetched shards with partial positions; exit: the
    rank's process fails (exit 1) in the second epoch, the group is restarted in place.
    Either way the launcher restarts the group, every rank loads the last model
    checkpoint and restores the ledger to it (DLRover loses the in-flight samples here)."""
    lines, watcher = await fail_and_restart(
        settings, tmp_path, f"ckpt-{unique}", f"rank=1,step={fail_step},how={how}"
    )
    last_checkpoint = fail_step // 10 * 10 - 1  # checkpoints after steps 9, 19, 29, ...
    assert restores(lines) == {(1, last_checkpoint)}
    undone = [
        ln for ln in lines if ln.get("incarnation") == 0 and ln.get("step", 0) > last_checkpoint
    ]
    assert undone, "the failed run trained past its checkpoint: those steps are redone"
    # The run's last step: 2 epochs of 25 steps, and a step more when an epoch has a tail.
    watcher.assert_followed_the_restart(max(ln["step"] for ln in lines if "step" in ln))


async def test_a_rank_killed_9_holding_claims_under_work_sharing_loses_and_repeats_nothing(
    settings: ServiceSettings, tmp_path: Path, unique: str
) -> None:
    """Work sharing on, rank 1 3x slow so it offers its share; it is killed -9 in step
    27 while it holds its first claim of the step (a later one may already be a
    helper's, since they take from the back, so a kill at a later claim may never come;
    where helpers took all of step 27's before its first claim, at its first claim of a
    later step). Nothing is lost or computed twice: a micro-batch's ids reach the model
    (and the sample log) only through the step's gradient all-reduce, which needs every
    rank, so no part of the killed step did; a ticket names one micro-batch, so within a
    completed step each micro-batch was computed by one rank; the restarted group
    reloads checkpoint 19 with the ledger restored to it, on a new store (claims of the
    dead run are gone), and redoes the steps from 20 from their shards, as without
    sharing."""
    lines, watcher = await fail_and_restart(
        settings,
        tmp_path,
        f"share-{unique}",
        "rank=1,step=27,how=kill,holding=0",
        ANTDT_POLICY_PARAMS='{"work_sharing": "on"}',
        ANTDT_INJECT="rank=1,factor=3",  # slow: it offers its share, the others help
    )
    killed = json.loads((tmp_path / "fault.json").read_text())["step"]  # 27, or a later one
    assert 27 <= killed <= 29  # where rank 1 held no claim of 27 (helpers took them all)
    assert restores(lines) == {(1, 19)}
    assert [ln for ln in lines if ln.get("incarnation") == 0 and ln.get("step", 0) >= killed] == []
    helped = [ln["step"] for ln in lines if "ids" in ln and len(ln["ids"]) > BATCH // WORLD]
    assert helped, "no rank ever computed another's micro-batch: sharing was off"
    watcher.assert_followed_the_restart(max(ln["step"] for ln in lines if "step" in ln))


async def fail_and_restart(
    settings: ServiceSettings, tmp_path: Path, job: str, fail: str, **extra: str
) -> tuple[list[dict[str, Any]], HealthWatch]:
    """The demo job with checkpoints every 10 steps and the fault `fail`, restarted once;
    its audited sample log and the monitor's view."""
    running = await start_services(settings)
    watcher = await HealthWatch.start(settings, job, running.by_name["monitor"])
    try:
        env = job_env(
            settings,
            job,
            tmp_path,
            ANTDT_DEMO_CKPT_DIR=str(tmp_path),
            ANTDT_DEMO_CKPT_EVERY="10",
            ANTDT_DEMO_FAIL=fail,
            **extra,
        )
        assert await run_job(env, max_restarts=1) == 0
        await wait_for(lambda: watcher.ended, timeout=15, what="the job's end, seen by the monitor")
    finally:
        await running.runtime.shutdown()
        await watcher.bus.close()
    return audit(tmp_path), watcher


@dataclass
class HealthWatch:
    """The monitor's view of a job restarted from a checkpoint: its health reports, and
    its detector's rejections (the detector is dropped when the job ends)."""

    bus: Bus
    healths: list[JobHealth] = field(default_factory=list)
    detector: Any = None

    @classmethod
    async def start(cls, settings: ServiceSettings, job: str, monitor: Any) -> HealthWatch:
        watch = cls(await Bus(settings.nats, name="health-watch").connect())

        async def on_health(health: JobHealth, _: Delivery) -> None:
            watch.healths.append(health)
            watch.detector = monitor.detectors.get(job, watch.detector)

        subjects = Subjects(settings.nats.subject_prefix)
        await watch.bus.subscribe(subjects.health(job), JobHealth, on_health)
        return watch

    @property
    def ended(self) -> bool:
        return bool(self.healths) and all(
            r.state is RankState.EXITED for r in self.healths[-1].ranks
        )

    def assert_followed_the_restart(self, last_step: int) -> None:
        """The monitor saw the restarted ranks come back (`restarting` from their hellos to
        their first steps), took in every step of the restarted run, none refused as a
        step back (they repeat the failed run's steps after the checkpoint), up to the
        last, and reported no rank stalled once they were back."""
        assert self.detector is not None, "the monitor never watched the job"
        assert self.detector.rejected.get("step_backwards", 0) == 0
        coming = [i for i, h in enumerate(self.healths) if RankState.RESTARTING in _states(h)]
        assert coming, f"no rank seen restarting: {[_states(h) for h in self.healths]}"
        back = self.healths[coming[-1] :]
        assert max(h.step for h in back) == last_step
        stalled = [h.step for h in back if RankState.STALLED in _states(h)]
        assert not stalled, f"stalled after the restart at steps {stalled}"


def _states(health: JobHealth) -> set[RankState]:
    return {r.state for r in health.ranks}


# ------------------------------------------ a rank removed without a rollback


async def test_a_rank_removed_without_rollback_hands_back_exactly_what_it_had_not_trained(
    settings: ServiceSettings, tmp_path: Path, unique: str
) -> None:
    """After step 20 (mid-epoch 0) the highest rank leaves (agent.leave) and the other
    two re-form a smaller gloo group and train on: no rollback, so the leaver's updates
    stay in the model and only its untrained remainder goes back to the ledger."""
    running = await start_services(settings, names=("controller", "shards"))
    try:
        env = job_env(settings, f"shrink-{unique}", tmp_path, ANTDT_DEMO_LEAVE="step=20")
        assert await run_job(env) == 0
    finally:
        await running.runtime.shutdown()
    lines = audit(tmp_path)
    leaver = [ln["step"] for ln in lines if ln["rank"] == WORLD - 1 and "ids" in ln]
    stayers = [ln["step"] for ln in lines if ln["rank"] == 0 and "ids" in ln]
    assert max(leaver) == 20 and max(stayers) > 40


async def test_a_rank_handing_its_shards_back_after_the_others_ran_out_is_not_stranded(
    settings: ServiceSettings, tmp_path: Path, unique: str, bus: Bus
) -> None:
    """As above, but the leaver hands its shards back only once the two others have run
    out of data in epoch 0 and wait to leave it (told its shards are still held). They
    take them up in epoch 0 and go on. Before, they had asked for epoch 1 by then: the
    shards went back into an epoch nobody asked for again, and epoch 1 never started."""
    running = await start_services(settings, names=("controller", "shards"))
    job, hold = f"late-{unique}", tmp_path / "hand-back"
    tap = await ShardsTap(bus, job).attach()

    def waiting(rank: int) -> bool:
        return any(f.settle and f.epoch == 0 and r.outstanding for f, r in tap.answered(rank))

    try:
        env = job_env(settings, job, tmp_path, ANTDT_DEMO_LEAVE=f"step=20,hold={hold}")
        training = asyncio.ensure_future(run_job(env))
        await wait_for(lambda: waiting(0) and waiting(1), timeout=60, what="both waiting")
        assert not training.done()
        hold.touch()
        assert await asyncio.wait_for(training, 120) == 0
    finally:
        await running.runtime.shutdown()
    lines = audit(tmp_path)
    # The hand-back took the group back into epoch 0 (a settle answered "shards to grant")
    # and the shards went to the two others as new attempts.
    assert any(f.settle and r.status is FetchStatus.OK for f, r in tap.answered())
    regranted = {g.shard for _, r in tap.answered() for g in r.grants if g.epoch == 0 and g.attempt}
    assert regranted
    assert max(ln["step"] for ln in lines if ln["rank"] == 0 and "ids" in ln) > 40


# ---------------------------------------------- infrastructure faults, one run


@pytest.fixture
async def own_cluster(tmp_path: Path) -> AsyncIterator[EmbeddedCluster]:
    """Servers this test may kill and restart without disturbing the others."""
    cluster = await asyncio.to_thread(EmbeddedCluster(root=tmp_path / "servers", keep=True).start)
    yield cluster
    await asyncio.to_thread(cluster.stop)


def shards_replica(
    cluster: EmbeddedCluster, prefix: str, key_prefix: str, replica_id: str
) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ,
        ANTDT_NATS__SUBJECT_PREFIX=prefix,
        ANTDT_ETCD__KEY_PREFIX=key_prefix,
        ANTDT_TELEMETRY__LOG_FORMAT="json",
        ANTDT_REPLICA_ID=replica_id,
        ANTDT_ETCD__LEASE_TTL_S="2",
    )
    argv = [
        sys.executable,
        "-m",
        "antdt.cli",
        "shards",
        "--nats-url",
        cluster.nats.url,
        "--etcd-endpoint",
        cluster.etcd.endpoint,
    ]
    return subprocess.Popen(argv, env=env, start_new_session=True)


async def test_shards_replica_nats_and_etcd_faults_lose_and_repeat_nothing(
    own_cluster: EmbeddedCluster, tmp_path: Path, unique: str
) -> None:
    """Mid-run: kill -9 the one of two shards replicas that owns the job, which the ranks
    send their fetches to (they fall back to the queue group, the other takes the job
    over), restart nats-server, kill -9 etcd and restart it on the same data dir."""
    settings = ServiceSettings(
        nats=NatsSettings(url=own_cluster.nats.url, subject_prefix=f"antdt.{unique}"),
        etcd=EtcdSettings(
            endpoint=own_cluster.etcd.endpoint, key_prefix=f"/{unique}/", lease_ttl_s=2, timeout_s=2
        ),
        replica_id=f"replica-{unique}",
    )
    running = await start_services(settings, names=("controller",))  # registers the job
    replicas = {
        f"shards-{i}": shards_replica(
            own_cluster, settings.nats.subject_prefix, settings.etcd.key_prefix, f"shards-{i}"
        )
        for i in range(2)
    }
    store = await Store(settings.etcd).connect()
    job = f"infra-{unique}"
    watcher, reached = await watch_steps(settings, job)
    faults: list[str] = []

    async def inject() -> None:
        await wait_for(lambda: reached() >= 12, timeout=120, what="step 12")
        owner = await store.get(Keys(settings.etcd.key_prefix).owner("shards", job))
        assert owner is not None, "no shards replica owns the job"
        replicas[owner.value.decode()].kill()  # SIGKILL
        faults.append("shards replica killed")
        await wait_for(lambda: reached() >= 31, timeout=120, what="step 31")
        await asyncio.to_thread(own_cluster.nats.stop)
        await asyncio.to_thread(own_cluster.nats.start)
        faults.append("nats restarted")
        await wait_for(lambda: reached() >= 40, timeout=120, what="step 40")
        own_cluster.etcd.kill()
        await asyncio.sleep(1.0)  # an outage, not a blip: fetches fail meanwhile
        await asyncio.to_thread(own_cluster.etcd.start)
        faults.append("etcd killed and restarted")

    try:
        env = job_env(settings, job, tmp_path, ANTDT_DEMO_MIN_STEP_S="0.08")
        injector = asyncio.create_task(inject())
        assert await run_job(env) == 0
        await injector
    finally:
        for proc in replicas.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
        await store.close()
        await running.runtime.shutdown()
        await watcher.close()
    assert faults == ["shards replica killed", "nats restarted", "etcd killed and restarted"]
    audit(tmp_path)


async def watch_steps(settings: ServiceSettings, job: str) -> tuple[Bus, Callable[[], int]]:
    """The highest step rank 0 has reported (a bus that survives the nats restart)."""
    bus = await Bus(settings.nats, name="watch").connect()
    highest = [-1]

    async def on_step(event: StepEvent, _: Delivery) -> None:
        highest[0] = max(highest[0], event.step)

    await bus.subscribe(Subjects(settings.nats.subject_prefix).step(job, 0), StepEvent, on_step)
    return bus, lambda: highest[0]
