"""Per-job monitor params against real nats-server and etcd: one monitor replica, three
jobs whose specs carry different params (one of them unusable), the same 1.3x straggler
in each; every job is judged by its own window and threshold."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.store import Store
from antdt.schemas import Incident, IncidentKind, JobSpec, Keys, MonitorParams, StepEvent, Subjects
from antdt.services.monitor.service import MonitorService, MonitorSettings
from antdt.services.runner import start_service
from tests.helpers import step_event, wait_for

pytestmark = pytest.mark.integration

STEPS = 24


@pytest.fixture
async def monitor(settings: ServiceSettings) -> AsyncIterator[MonitorService]:
    """One replica whose own defaults differ from the detector's (W=6, δ=0.25, K=3)."""
    runtime = ServiceRuntime("test-monitor")
    replica = MonitorSettings(
        **settings.model_dump(), window=6, slow_threshold=0.25, persistent_windows=3
    )
    service = await start_service("monitor", replica, runtime)
    yield service
    await runtime.shutdown()


def spec_bytes(job: str, monitor: MonitorParams | dict | None) -> bytes:
    spec = JobSpec(job=job, world_size=2, dataset_size=100, shard_size=10, global_batch=8)
    fields = json.loads(spec.model_dump_json())
    fields["monitor"] = monitor.model_dump() if isinstance(monitor, MonitorParams) else monitor
    return json.dumps(fields).encode()


def step(job: str, rank: int, n: int) -> StepEvent:
    compute = 0.13 if rank == 1 else 0.1  # rank 1: 1.3x the compute per sample of rank 0
    return step_event(job, rank, n, compute_s=compute, started_at=1000.0 + n * 0.2)


async def test_jobs_on_one_replica_are_judged_by_their_own_params(
    monitor: MonitorService, bus: Bus, store: Store, settings: ServiceSettings
) -> None:
    keys, subjects = Keys(settings.etcd.key_prefix), Subjects(settings.nats.subject_prefix)
    jobs = {
        "tight": MonitorParams(window=4, slow_threshold=0.2),  # 1.3x is slow
        "loose": MonitorParams(slow_threshold=0.4),  # 1.3x is within the threshold
        "broken": {"window": 0},  # unusable: the replica's defaults (δ=0.25: slow)
    }
    for job, params in jobs.items():
        await store.put(keys.spec(job), spec_bytes(job, params))
    incidents: list[Incident] = []

    async def on_incident(incident: Incident, _: object) -> None:
        incidents.append(incident)

    await bus.subscribe(subjects.any_job("incident"), Incident, on_incident)
    # The claim loop takes every job with a spec; then no first event is dropped.
    await wait_for(lambda: all(monitor.ownership.owns(j) for j in jobs), what="jobs claimed")
    for n in range(STEPS):
        for job in jobs:
            for rank in (0, 1):
                await bus.publish(subjects.step(job, rank), step(job, rank, n))
    await wait_for(lambda: monitor.ingested == STEPS * 2 * len(jobs), what="every step ingested")
    await wait_for(lambda: {i.job for i in incidents} == {"tight", "broken"}, what="incidents")

    configs = {job: monitor.detectors[job].config for job in jobs}
    replica = monitor.settings.detector_config()
    assert (configs["tight"].window, configs["tight"].slow_threshold) == (4, 0.2)
    assert (configs["loose"].window, configs["loose"].slow_threshold) == (6, 0.4)
    assert configs["tight"].persistent_windows == configs["loose"].persistent_windows == 3
    assert configs["broken"] == replica
    assert {(i.job, i.rank, i.kind) for i in incidents} == {
        ("tight", 1, IncidentKind.SLOW),
        ("broken", 1, IncidentKind.SLOW),
    }
    # "loose" measured the same straggler and stayed quiet: only its threshold differs.
    loose = monitor.detectors["loose"]
    assert loose.open_incidents == ()
    assert loose.health(2000.0).ranks[1].ratio == pytest.approx(1.3)
    assert monitor.bus.rejections.total() == 0 and monitor.bus.handler_errors == 0
