"""Monitor replicas share the ingest: jobs spread over them (placement), and each step
event reaches its job's owner alone (a subscription per owned job), against real
nats-server and etcd. A replica that leaves has its jobs taken over, steps and all."""

from __future__ import annotations

import asyncio
import time

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.runtime.coordination.placement import preferred
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.store import Store
from antdt.schemas import (
    IncidentState,
    JobSpec,
    Keys,
    RankHello,
    StepEvent,
    Subjects,
)
from antdt.services.monitor.service import MonitorService, MonitorSettings
from antdt.services.runner import start_service
from tests.helpers import step_event, wait_for
from tests.integration.test_monitor_ha import first_in, publish_steps, watch_incidents

pytestmark = pytest.mark.integration

REPLICAS = ("m-a", "m-b")
STEPS = 5
RANKS = 2


def _jobs(unique: str) -> list[str]:
    """Eight job ids, four preferred by each replica."""
    by_replica: dict[str, list[str]] = {r: [] for r in REPLICAS}
    n = 0
    while any(len(jobs) < 4 for jobs in by_replica.values()):
        job = f"pl{unique}-{n}"
        owner = preferred(job, REPLICAS)
        assert owner is not None
        if len(by_replica[owner]) < 4:
            by_replica[owner].append(job)
        n += 1
    return sorted(j for jobs in by_replica.values() for j in jobs)


def _step(job: str, rank: int, n: int) -> StepEvent:
    return step_event(job, rank, n)


async def _start(settings: ServiceSettings, name: str) -> tuple[ServiceRuntime, MonitorService]:
    runtime = ServiceRuntime(name)
    fields = {**settings.model_dump(), "replica_id": name}
    monitor = await start_service("monitor", MonitorSettings(**fields), runtime)
    return runtime, monitor


async def _publish_steps(bus: Bus, subjects: Subjects, jobs: list[str], steps: range) -> None:
    for job in jobs:
        for n in steps:
            for rank in range(RANKS):
                await bus.publish(subjects.step(job, rank), _step(job, rank, n))
    await bus.flush()


async def test_each_replica_receives_only_the_steps_of_the_jobs_it_owns(
    settings: ServiceSettings, bus: Bus, store: Store, unique: str
) -> None:
    subjects, keys = Subjects(settings.nats.subject_prefix), Keys(settings.etcd.key_prefix)
    jobs = _jobs(unique)
    started = [await _start(settings, name) for name in REPLICAS]
    runtimes = {m.settings.replica_id: r for r, m in started}
    monitors = {m.settings.replica_id: m for _, m in started}
    try:
        members = keys.members("monitor")
        await wait_for(lambda: _count(store, members, 2), what="both replicas are members")
        for m in monitors.values():  # and each knows it (its member list is a round's)
            await wait_for(lambda m=m: m.intake.replicas == list(REPLICAS), what="members read")
        await _register_and_start(bus, store, keys, subjects, jobs)
        # Each replica records a claim once its owner-key transaction has answered, a
        # moment after the key is in etcd: wait on what the replicas know, not on etcd.
        await wait_for(
            lambda: sum(len(m.ownership.jobs) for m in monitors.values()) >= len(jobs),
            what="every job owned",
        )

        owned = {name: set(m.ownership.jobs) for name, m in monitors.items()}
        assert owned["m-a"] | owned["m-b"] == set(jobs) and not owned["m-a"] & owned["m-b"]
        # Claimed on their hellos by their preferred replicas: four each.
        for name, m in monitors.items():
            assert owned[name] == {j for j in jobs if preferred(j, REPLICAS) == name}
            assert m.intake.watched == sorted(owned[name])

        await _publish_steps(bus, subjects, jobs, range(STEPS))
        per_job = STEPS * RANKS
        for name, m in monitors.items():
            expected = per_job * len(owned[name])
            await wait_for(lambda m=m, e=expected: m.ingested >= e, what=f"{name} ingests")
        await _publish_steps(bus, subjects, jobs[:1], range(STEPS, STEPS + 1))  # a marker
        marker_owner = monitors[preferred(jobs[0], REPLICAS) or ""]
        await wait_for(lambda: marker_owner.ingested == per_job * 4 + RANKS, what="marker")
        for name, m in monitors.items():  # nothing of another's jobs ever reached it
            assert m.ingested == per_job * len(owned[name]) + (RANKS if m is marker_owner else 0)
            assert m.dropped_not_owner == 0
            assert set(m.detectors) == owned[name]

        # m-a leaves (its lease revoked at shutdown): m-b takes its jobs, steps and all.
        await runtimes.pop("m-a").shutdown()
        survivor = monitors["m-b"]
        await wait_for(
            lambda: set(survivor.ownership.jobs) == set(jobs), timeout=15, what="m-b owns every job"
        )
        assert survivor.intake.watched == jobs
        before = survivor.ingested
        await _publish_steps(bus, subjects, jobs, range(STEPS + 1, STEPS + 3))
        await wait_for(
            lambda: survivor.ingested == before + 2 * RANKS * len(jobs),
            what="m-b ingests every job's steps",
        )
    finally:
        for runtime in runtimes.values():
            await runtime.shutdown()


async def test_a_replica_started_later_is_handed_its_share_of_the_jobs(
    settings: ServiceSettings, bus: Bus, store: Store, unique: str
) -> None:
    """m-a runs alone and claims every job; m-b starts: once it has been a member for a
    while, m-a hands it the jobs placement prefers it for, one a claim round, and from
    then on their steps reach m-b alone."""
    subjects, keys = Subjects(settings.nats.subject_prefix), Keys(settings.etcd.key_prefix)
    jobs = _jobs(unique)
    runtimes = []
    try:
        runtime, first = await _start(settings, "m-a")
        runtimes.append(runtime)
        await wait_for(lambda: first.intake.replicas == ["m-a"], what="m-a knows itself")
        await _register_and_start(bus, store, keys, subjects, jobs)
        await wait_for(lambda: first.ownership.jobs == jobs, what="m-a claims every job")
        runtime, later = await _start(settings, "m-b")
        runtimes.append(runtime)
        theirs = sorted(j for j in jobs if preferred(j, REPLICAS) == "m-b")
        await wait_for(
            lambda: later.ownership.jobs == theirs, timeout=30, what="m-b is handed its jobs"
        )
        assert first.ownership.jobs == sorted(set(jobs) - set(theirs))
        assert later.intake.watched == theirs
        assert first.intake.watched == first.ownership.jobs
        await _publish_steps(bus, subjects, jobs, range(STEPS))
        await wait_for(lambda: later.ingested == STEPS * RANKS * len(theirs), what="m-b's")
        await wait_for(
            lambda: first.ingested == STEPS * RANKS * (len(jobs) - len(theirs)), what="m-a's"
        )
        assert set(later.detectors) == set(theirs) and later.dropped_not_owner == 0
    finally:
        for runtime in runtimes:
            await runtime.shutdown()


async def test_a_job_with_an_incident_open_is_handed_over_and_its_incident_carried_on(
    settings: ServiceSettings, bus: Bus, store: Store, unique: str
) -> None:
    """m-a owns a job whose rank 1 straggles, its incident open; m-b, the job's preferred
    replica, starts: m-a hands the job over all the same, its transitions stored first,
    and m-b carries the incident on and resolves it, under its id, once the rank is back
    to speed."""
    job = next(j for n in range(100) if preferred(j := f"ho{unique}-{n}", REPLICAS) == "m-b")
    incidents = await watch_incidents(settings, bus, store, job, 4)
    slow, stop = {1}, asyncio.Event()
    runtimes = []
    publisher = asyncio.create_task(publish_steps(bus, job, 4, stop, every_s=0.02, slow=slow))
    try:
        runtime, first = await _start(settings, "m-a")
        runtimes.append(runtime)
        opened = await wait_for(
            lambda: first_in(incidents, IncidentState.OPENED),
            timeout=30,
            what="the straggler's incident opened on m-a",
        )
        assert first.ownership.jobs == [job] and opened.rank == 1
        runtime, later = await _start(settings, "m-b")
        runtimes.append(runtime)
        await wait_for(
            lambda: later.ownership.jobs == [job], timeout=30, what="m-b is handed the job"
        )
        assert job not in first.detectors
        await wait_for(lambda: job in later.detectors, what="m-b takes the job on")
        assert [i.id for i in later.detectors[job].open_incidents] == [opened.id]
        slow.clear()  # the rank is back to speed
        resolved = await wait_for(
            lambda: first_in(incidents, IncidentState.RESOLVED),
            timeout=30,
            what="the incident resolved by m-b",
        )
    finally:
        stop.set()
        await publisher
        for runtime in runtimes:
            await runtime.shutdown()
    assert resolved.id == opened.id
    assert [i.id for i in incidents if i.state is IncidentState.OPENED] == [opened.id]


async def _register_and_start(
    bus: Bus, store: Store, keys: Keys, subjects: Subjects, jobs: list[str]
) -> None:
    """Each job's spec, then a hello of its rank 0 (as an agent starting)."""
    for job in jobs:
        spec = JobSpec(job=job, world_size=RANKS, dataset_size=80, shard_size=10, global_batch=8)
        await store.put(keys.spec(job), spec.model_dump_json().encode())
        hello = RankHello(
            job=job, rank=0, world_size=RANKS, host="h0", pid=1, started_at=time.time()
        )
        await bus.publish(subjects.hello(job, 0), hello)


async def _count(store: Store, prefix: str, n: int) -> bool:
    return len(await store.get_prefix(prefix, keys_only=True)) >= n
