"""Monitor high availability: two replicas as separate processes against real nats-server
and etcd; kill -9 the job's owner, the other replica takes the job over within the lease
TTL plus one claim interval and keeps publishing JobHealth."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.runtime.store import Store
from antdt.schemas import Incident, IncidentState, JobHealth, JobSpec, Keys, StepEvent, Subjects
from tests.helpers import service_replicas, step_event, wait_for

pytestmark = pytest.mark.integration

JOB = "hajob"


def step(rank: int, n: int, job: str = JOB, slow: bool = False, step_s: float = 0.04) -> StepEvent:
    """Rank `rank`'s step `n`: 30 ms of compute (3x that when `slow`) in `step_s`."""
    compute = 0.09 if slow else 0.03
    return step_event(
        job, rank, n, compute_s=compute, step_s=step_s, started_at=1000.0 + n * step_s
    )


async def publish_steps(
    bus: Bus,
    job: str,
    world: int,
    stop: asyncio.Event,
    *,
    every_s: float,
    slow: set[int] | None = None,
) -> None:
    """Every rank's next step every `every_s` until `stop`; the ranks in `slow` (read each
    step: the caller may empty it) at 3x, everyone waiting for them at the barrier."""
    subjects, slow = Subjects(bus.settings.subject_prefix), slow if slow is not None else set()
    n = 0
    while not stop.is_set():
        step_s = 0.1 if slow else 0.04
        for rank in range(world):
            await bus.publish(subjects.step(job, rank), step(rank, n, job, rank in slow, step_s))
        n += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


def replicas(
    settings: ServiceSettings, names: list[str], logs: Path, env: dict[str, str] | None = None
) -> Any:
    return service_replicas("monitor", settings, names, logs, env)


async def test_owner_killed_another_replica_takes_over(
    settings: ServiceSettings, bus: Bus, store: Store, tmp_path: Path
) -> None:
    keys, subjects = Keys(settings.etcd.key_prefix), Subjects(settings.nats.subject_prefix)
    spec = JobSpec(job=JOB, world_size=2, dataset_size=100, shard_size=10, global_batch=8)
    await store.put(keys.spec(JOB), spec.model_dump_json().encode())
    healths: list[tuple[float, JobHealth]] = []

    async def on_health(health: JobHealth, _: object) -> None:
        healths.append((time.monotonic(), health))

    await bus.subscribe(subjects.health(JOB), JobHealth, on_health)
    stop = asyncio.Event()
    names = ["monitor-a", "monitor-b"]
    publisher = asyncio.create_task(publish_steps(bus, JOB, 2, stop, every_s=0.05))
    try:
        with replicas(settings, names, tmp_path) as procs:
            first = await wait_for(
                lambda: _owner(store, keys, JOB), timeout=60, what="a replica owns the job"
            )
            assert first in names
            await wait_for(lambda: any(h.ranks and h.step > 0 for _, h in healths), what="health")
            procs[first].send_signal(signal.SIGKILL)
            procs[first].wait(timeout=10)
            killed_at = time.monotonic()
            survivor = next(n for n in names if n != first)
            await wait_for(
                lambda: _owned_by(store, keys, JOB, survivor),
                timeout=30,
                interval=0.05,
                what="takeover",
            )
            takeover_s = time.monotonic() - killed_at
            await wait_for(
                lambda: sum(1 for t, h in healths if t > killed_at + takeover_s) >= 2,
                timeout=10,
                what="health from the survivor",
            )
            after = [h for t, h in healths if t > killed_at + takeover_s]
            assert procs[survivor].poll() is None
    finally:
        stop.set()
        await publisher
    ttl = settings.etcd.lease_ttl_s
    claim_interval = ttl / 2
    print(f"\ntakeover after kill -9: {takeover_s:.2f}s (ttl {ttl}s + claim {claim_interval}s)")
    # etcd expires leases on its own tick (up to ~0.5 s late): allow 1 s of slack.
    assert takeover_s <= ttl + claim_interval + 1.0
    assert after[-1].step > 0 and len(after[-1].ranks) == 2


@pytest.mark.parametrize("then", ["rank_recovers", "ranks_fall_silent"])
async def test_the_replica_taking_over_carries_on_the_incident_left_open(
    settings: ServiceSettings, bus: Bus, store: Store, tmp_path: Path, then: str
) -> None:
    """A straggler's incident is open when its owner is killed -9: the survivor adopts it
    from ANTDT_INCIDENTS and resolves it under its id, either once the rank is back to
    speed, or, when the ranks fell silent with the owner (their launcher died with it),
    when it ends the job as abandoned: it takes the job on with no rank heard from
    `abandon_after_s` after its claim."""
    job, world = f"hajob-incident-{then}", 4
    keys = Keys(settings.etcd.key_prefix)
    incidents = await watch_incidents(settings, bus, store, job, world)
    slow, stop = {1}, asyncio.Event()
    names = ["monitor-a", "monitor-b"]
    publisher = asyncio.create_task(publish_steps(bus, job, world, stop, every_s=0.02, slow=slow))
    abandon = {"ANTDT_ABANDON_AFTER_S": "3"}
    try:
        with replicas(settings, names, tmp_path, abandon) as procs:
            first = await wait_for(
                lambda: _owner(store, keys, job), timeout=60, what="a replica owns the job"
            )
            opened = await wait_for(
                lambda: first_in(incidents, IncidentState.OPENED),
                timeout=30,
                what="the straggler's incident opened",
            )
            assert opened.rank == 1
            if then == "ranks_fall_silent":
                stop.set()
                await publisher
            procs[first].send_signal(signal.SIGKILL)
            procs[first].wait(timeout=10)
            survivor = next(n for n in names if n != first)
            await wait_for(
                lambda: _owned_by(store, keys, job, survivor), timeout=30, what="takeover"
            )
            slow.clear()  # the rank is back to speed (if the ranks still run)
            resolved = await wait_for(
                lambda: first_in(incidents, IncidentState.RESOLVED),
                timeout=30,
                what="the survivor resolves it",
            )
            if then == "ranks_fall_silent":
                # Its end is recorded after its resolutions are out (and the replicas
                # are stopped on leaving this block): wait for it here.
                await wait_for(
                    lambda: _ended(store, keys, job), timeout=30, what="the job ended as abandoned"
                )
    finally:
        stop.set()
        await publisher
    assert resolved.id == opened.id
    assert [i.id for i in incidents if i.state is IncidentState.OPENED] == [opened.id]


async def watch_incidents(
    settings: ServiceSettings, bus: Bus, store: Store, job: str, world: int
) -> list[Incident]:
    """Register `job` (its spec, `world` ranks); the list its incidents are added to as
    they are published."""
    keys, subjects = Keys(settings.etcd.key_prefix), Subjects(settings.nats.subject_prefix)
    spec = JobSpec(
        job=job, world_size=world, dataset_size=100, shard_size=10, global_batch=4 * world
    )
    await store.put(keys.spec(job), spec.model_dump_json().encode())
    incidents: list[Incident] = []

    async def on_incident(incident: Incident, _: object) -> None:
        incidents.append(incident)

    await bus.subscribe(subjects.incident(job), Incident, on_incident)
    return incidents


def first_in(incidents: list[Incident], state: IncidentState) -> Incident | None:
    return next((i for i in incidents if i.state is state), None)


async def _owner(store: Store, keys: Keys, job: str) -> str | None:
    got = await store.get(keys.owner("monitor", job))
    return got.value.decode() if got else None


async def _owned_by(store: Store, keys: Keys, job: str, replica: str) -> bool:
    return await _owner(store, keys, job) == replica


async def _ended(store: Store, keys: Keys, job: str) -> bool:
    return await store.get(keys.ended(job)) is not None
