"""A controller replica taking a job on (a registration here; a failover is the same
load) decides knowing the incidents still open on ANTDT_INCIDENTS: with none known,
lb-bsp takes a mitigating plan for a balanced job's and undoes it, and antdt-nd never
restarts a persistent straggler whose next transition is its resolution. Real
nats-server with JetStream, real etcd."""

from __future__ import annotations

import time

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.schemas import (
    INCIDENT_STREAM,
    Incident,
    IncidentKind,
    IncidentState,
    JobSpec,
    RegisterReply,
    StragglerClass,
    Subjects,
)
from antdt.services.controller.service import ControllerService
from antdt.services.runner import settings_class, start_service
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


def incident(job: str, rank: int, state: IncidentState, cls: StragglerClass) -> Incident:
    now = time.time()
    return Incident(
        id=f"{job}-r{rank}-slow-1",
        job=job,
        rank=rank,
        host=f"slot{rank}",
        kind=IncidentKind.SLOW,
        straggler_class=cls,
        state=state,
        step=40,
        opened_at=now,
        updated_at=now,
        ratio=3.0,
        windows=3,
    )


async def test_a_job_taken_on_is_decided_knowing_its_open_incidents(
    settings: ServiceSettings, bus: Bus, unique: str
) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    await bus.jetstream.ensure_stream(INCIDENT_STREAM, [subjects.any_job("incident")])
    left = [
        incident(unique, 3, IncidentState.OPENED, StragglerClass.UNKNOWN),
        incident(unique, 3, IncidentState.ESCALATED, StragglerClass.PERSISTENT),
        incident(unique, 1, IncidentState.OPENED, StragglerClass.UNKNOWN),
        incident(unique, 1, IncidentState.RESOLVED, StragglerClass.TRANSIENT),
    ]
    for n, each in enumerate(left):
        await bus.jetstream.publish(subjects.incident(unique), each, msg_id=f"{unique}-{n}")
    runtime = ServiceRuntime("test-controller")
    cls = settings_class("controller")
    controller = await start_service("controller", cls(**settings.model_dump()), runtime)
    assert isinstance(controller, ControllerService)
    try:
        spec = JobSpec(job=unique, world_size=4, dataset_size=64, shard_size=8, global_batch=8)
        await bus.request(subjects.register(unique), spec, RegisterReply)
        state = await wait_for(lambda: controller.jobs.get(unique), what="the job's state")
        assert [(i.rank, i.state) for i in state.incidents.values()] == [
            (3, IncidentState.ESCALATED)
        ]
        assert (
            state.view(time.time()).open_incidents[0].straggler_class is StragglerClass.PERSISTENT
        )
    finally:
        await runtime.shutdown()
