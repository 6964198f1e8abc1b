"""The controller's per-job state when the first events of a job arrive together: the
JobHealth and the Incident that the monitor publishes back to back right after the
controller claimed the job must land in one state (one decision lock, the health kept),
so that the incident's decision sees the health and acts."""

from __future__ import annotations

import time

import pytest

from antdt.bench.ranks import AckingRanks
from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.schemas import (
    INCIDENT_STREAM,
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
from tests.e2e.conftest import start_services

pytestmark = pytest.mark.integration
WORLD = 4


def health(job: str) -> JobHealth:
    ranks = tuple(
        RankHealth(rank=r, host=f"h{r}", state=RankState.SLOW if r == 3 else RankState.OK,
                   last_step=100, local_batch=16, samples_per_s=100.0 if r == 3 else 300.0,
                   compute_s_per_sample=0.01, ratio=1.0, data_wait_share=0.0, comm_share=0.1)
        for r in range(WORLD)
    )  # fmt: skip
    return JobHealth(job=job, at=time.time(), step=100, step_s=0.1, samples_per_s=1.0,
                     balance_efficiency=0.5, plan_version=0, ranks=ranks)  # fmt: skip


async def test_first_health_and_incident_share_one_state(
    settings: ServiceSettings, bus: Bus
) -> None:
    running = await start_services(settings, ("controller",))
    job, subjects = "first-events", Subjects(settings.nats.subject_prefix)
    ranks = await AckingRanks(settings.nats, job, WORLD).start()
    try:
        await bus.ensure_stream(INCIDENT_STREAM, [subjects.any_job("incident")], max_age_s=600)
        spec = JobSpec(job=job, world_size=WORLD, dataset_size=1000, shard_size=10,
                       global_batch=64, policy="lb-bsp")  # fmt: skip
        await bus.request(subjects.register(job), spec, RegisterReply)
        now = time.time()
        incident = Incident(id="i1", job=job, rank=3, host="h3", kind=IncidentKind.SLOW,
                            state=IncidentState.OPENED, step=100, opened_at=now, updated_at=now,
                            ratio=3.0, windows=3)  # fmt: skip
        await bus.publish(subjects.health(job), health(job))
        await bus.js_publish(subjects.incident(job), incident)
        await ranks.wait_version(1, timeout=10)
        state = running.by_name["controller"].jobs[job]
        assert state.health is not None and "i1" in state.incidents
    finally:
        await ranks.close()
        await running.runtime.shutdown()
