"""Latency benchmark: incident to plan applied on every rank, with the real controller
and stand-in ranks (`bench.ranks`) in another process, against a raw NATS
request/reply round trip measured in the same run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from typing import Any

from antdt.runtime.bus import Bus
from antdt.runtime.config import NatsSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store
from antdt.schemas import (
    INCIDENT_STREAM,
    ActionRecord,
    Incident,
    IncidentKind,
    IncidentState,
    JobHealth,
    JobSpec,
    RankHealth,
    RankState,
    RegisterReply,
    Subjects,
)
from bench.cases import _settings
from bench.children import start_module


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[int(0.99 * (len(ordered) - 1))] * 1000,
        "max_ms": ordered[-1] * 1000,
        "samples": len(ordered),
    }


async def bench_raw_request(url: str, *, rounds: int) -> dict[str, float]:
    """Baseline: a bare request (the Bus's request path, bytes) → responder on another
    connection → reply, one at a time, with a payload the size of an AdjustBatch for 32
    ranks."""
    payload = b"x" * 1200
    client = await Bus(NatsSettings(url=url), name="raw-req").connect()
    server = await Bus(NatsSettings(url=url), name="raw-rep").connect()

    async def on_msg(msg: Any) -> None:
        await msg.respond(msg.data)

    await server.nc.subscribe("raw.rtt", cb=on_msg)
    await server.flush()
    samples = []
    for n in range(rounds + 20):
        started = time.perf_counter()
        await client.request_raw("raw.rtt", payload, timeout=2.0)
        if n >= 20:  # warm-up
            samples.append(time.perf_counter() - started)
    await client.close()
    await server.close()
    return _percentiles(samples)


#: Seconds between two JobHealth of one job from the monitor (its window), as the bench
#: re-sends a round's health when the plan has not come.
HEALTH_WINDOW_S = 1.0


def _plan_version(controller: Any, job: str) -> int | None:
    state = controller.jobs.get(job)
    return None if state is None else int(state.plan.version)


def _bench_health(job: str, ranks: int, slow: int, step: int, version: int) -> JobHealth:
    rows = tuple(
        RankHealth(
            rank=r,
            host=f"h{r}",
            state=RankState.SLOW if r == slow else RankState.OK,
            last_step=step,
            local_batch=32,
            samples_per_s=100.0 if r == slow else 300.0,
            compute_s_per_sample=0.01 if r == slow else 1 / 300,
            ratio=1.0,
            data_wait_share=0.0,
            comm_share=0.1,
        )
        for r in range(ranks)
    )
    return JobHealth(
        job=job,
        at=time.time(),
        step=step,
        step_s=0.1,
        samples_per_s=1000.0,
        balance_efficiency=0.5,
        plan_version=version,
        ranks=rows,
    )


async def bench_incident_to_plan(
    cluster: EmbeddedCluster, *, ranks: int, rounds: int
) -> dict[str, float]:
    """Incident -> plan on every rank: the real controller (lb-bsp, cooldown and settling off)
    and `ranks` stand-in ranks in another process. Each round publishes what the monitor
    does (the health, then the incident) and measures, wall clock, until the last rank holds
    the new plan, and until its ActionRecord."""
    from antdt.services.controller.service import ControllerService, ControllerSettings

    base = _settings(cluster, f"plan{ranks}-{time.monotonic_ns() % 10**9}")
    settings = ControllerSettings(**base.model_dump())
    runtime = ServiceRuntime("bench-controller")
    bus = await Bus(settings.nats, name="bench-controller").connect()
    store = await Store(settings.etcd).connect()
    controller = ControllerService(settings, bus, store)
    await controller.start(runtime)
    subjects, job = Subjects(base.nats.subject_prefix), "bench"
    client = await Bus(base.nats, name="bench-monitor").connect()
    await client.jetstream.ensure_stream(
        INCIDENT_STREAM, [subjects.any_job("incident")], max_age_s=600
    )
    spec = JobSpec(
        job=job,
        world_size=ranks,
        dataset_size=10**6,
        shard_size=1000,
        global_batch=32 * ranks,
        policy="lb-bsp",
        policy_params={"cooldown_s": 0.0, "settle_steps": 0},
    )
    await client.request(subjects.register(job), spec, RegisterReply)
    held: dict[int, dict[str, float]] = {}
    recorded: dict[int, float] = {}
    outcomes: dict[int, str] = {}  # plan version -> what its ActionRecord says
    changed = asyncio.Event()

    async def on_held(msg: Any) -> None:
        report = json.loads(msg.data)
        held[report["version"]] = report
        changed.set()

    async def on_record(record: ActionRecord, _: Any) -> None:
        if record.plan_version is not None:
            recorded[record.plan_version] = time.time()
            outcomes[record.plan_version] = (
                f"{record.result.value}, acked by {list(record.acked_ranks)}, missing "
                f"{list(record.missing_ranks)}{f', {record.error}' if record.error else ''}"
            )
            changed.set()

    report = f"{base.nats.subject_prefix}.bench.held"
    await client.nc.subscribe(report, cb=on_held)
    await client.subscribe(subjects.action(job), ActionRecord, on_record)
    stand_in = await start_module(
        "ranks",
        base.nats.url,
        base.nats.subject_prefix,
        job,
        str(ranks),
        report,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert stand_in.stdout is not None and stand_in.stdin is not None
    await asyncio.wait_for(stand_in.stdout.readline(), 60)  # "ready"
    to_ranks, to_record, step = [], [], 100
    for n in range(rounds + 10):
        slow, version = n % ranks, n + 1  # the plan version this round makes
        now = time.time()
        incident = Incident(
            id=f"bench-{n}",
            job=job,
            rank=slow,
            host=f"h{slow}",
            ratio=3.0,
            kind=IncidentKind.SLOW,
            state=IncidentState.OPENED,
            step=step,
            opened_at=now,
            updated_at=now,
            windows=3,
        )
        health = _bench_health(job, ranks, slow, step, version - 1)
        started = time.time()
        await client.publish(subjects.health(job), health)
        await client.jetstream.publish(subjects.incident(job), incident)
        deadline = time.monotonic() + 10.0
        resend_at = time.monotonic() + HEALTH_WINDOW_S
        while (version not in held or version not in recorded) and time.monotonic() < deadline:
            changed.clear()
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(changed.wait(), 0.5)
            undecided = (_plan_version(controller, job) or 0) < version
            if undecided and time.monotonic() >= resend_at:
                # The monitor's next window: a controller that let the round's events
                # pass (its lease lapsed under load, say) decides on this one. Not while
                # the plan is on its way: a second decision would make another version.
                await client.publish(subjects.health(job), health)
                resend_at = time.monotonic() + HEALTH_WINDOW_S
        if version not in held or version not in recorded:
            raise RuntimeError(
                f"round {n}: plan version {version} "
                + ("held by every rank" if version in held else "did not reach every rank")
                + (f", recorded ({outcomes[version]})" if version in recorded else ", not recorded")
                + f"; the controller owns {controller.ownership.jobs}, its plan is version "
                + f"{_plan_version(controller, job)}"
            )
        step += 1000  # past the new plan's effective step: no settling to wait for
        if n >= 10:  # warm-up
            to_ranks.append(held[version]["last"] - started)
            to_record.append(recorded[version] - started)
    stand_in.stdin.close()
    await stand_in.wait()
    await client.close()
    await runtime.shutdown()
    await store.close()
    figures = _percentiles(to_ranks)
    record = _percentiles(to_record)
    figures.update(record_p50_ms=record["p50_ms"], record_p99_ms=record["p99_ms"])
    return figures
