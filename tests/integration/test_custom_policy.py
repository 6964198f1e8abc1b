"""The example custom policy (examples/custom_policy/policy.py) as its own process against
real nats-server, etcd, monitor and controller, with stand-in ranks acking commands:
an incident on JetStream leads to its proposal being applied on every rank; a proposal
that breaks a memory cap is refused with the reason; restarted, it resumes after the last
incident it acknowledged (durable consumer)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.schemas import (
    ACTION_STREAM,
    INCIDENT_STREAM,
    ActionRecord,
    ActionResult,
    IncidentState,
    JobSpec,
    Plan,
    PlanRequest,
    RegisterReply,
    Subjects,
)
from antdt.testing import acking_ranks
from tests.e2e.conftest import RunningServices, start_services
from tests.helpers import wait_for
from tests.policyproc import PolicyProcess, announce_cap, incident, start_policy_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_policy" / "policy.py"
WORLD, BATCH = 4, 64


async def start_example(settings: ServiceSettings, job: str, durable: str) -> PolicyProcess:
    argv = [sys.executable, str(EXAMPLE), "--job", job, "--durable", durable]
    return await start_policy_process(settings, argv)


@pytest.fixture
async def services(settings: ServiceSettings) -> AsyncIterator[RunningServices]:
    running = await start_services(settings, ("monitor", "controller"), ack_deadline_s=2.0)
    yield running
    await running.runtime.shutdown()


async def test_example_policy_proposes_and_controller_applies_or_refuses(
    services: RunningServices, settings: ServiceSettings, bus: Bus, unique: str
) -> None:
    job, durable = f"custom-{unique}", f"example-{unique}"
    subjects = Subjects(settings.nats.subject_prefix)
    spec = JobSpec(job=job, world_size=WORLD, dataset_size=1000, shard_size=10, global_batch=BATCH)
    await bus.request(subjects.register(job), spec, RegisterReply)
    ranks = await acking_ranks(settings.nats, job, WORLD).start()
    example = await start_example(settings, job, durable)
    try:
        # 1. Rank 3 is 3x slower: 16 / 3 -> 5, the 11 freed samples go to ranks 0-2.
        await bus.jetstream.publish(subjects.incident(job), incident(job, 1, rank=3, ratio=3.0))
        await ranks.wait_version(1, timeout=20)
        applied = await wait_for(lambda: example.events("applied"), timeout=20, what="applied")
        assert applied[0]["plan_version"] == 1 and applied[0]["local_batch"] == [20, 20, 19, 5]
        plan = await bus.request(subjects.plan_get(job), PlanRequest(job=job, rank=0), Plan)
        assert plan.version == 1 and plan.local_batch == (20, 20, 19, 5)
        assert plan.policy == "proposal:example-policy"

        # 2. Rank 0 reports a memory cap of 20; rank 1 turns 2x slower: the example moves
        # 10 samples off rank 1, 4 of them to rank 0 (24 > 20): refused with the reason.
        jobs = services.by_name["controller"].jobs
        await announce_cap(bus, jobs, job, WORLD, rank=0, cap=20)
        await bus.jetstream.publish(subjects.incident(job), incident(job, 2, rank=1, ratio=2.0))
        refused = await wait_for(lambda: example.events("refused"), timeout=20, what="refused")
        assert refused[0]["code"] == "guardrail"
        assert refused[0]["reason"] == "rank 0: batch 24 exceeds its memory cap 20"

        records = (
            await bus.jetstream.read(ACTION_STREAM, subjects.action(job), ActionRecord)
        ).items
        assert [r.result for r in records] == [ActionResult.APPLIED, ActionResult.REFUSED]
        assert records[0].incident_id == f"{job}-i1" and records[0].acked_ranks == (0, 1, 2, 3)
        assert records[1].error == "guardrail: rank 0: batch 24 exceeds its memory cap 20"
        assert records[1].policy == "proposal:example-policy"
        plan = await bus.request(subjects.plan_get(job), PlanRequest(job=job, rank=0), Plan)
        assert plan.version == 1 and ranks.everyone_has(1) and not ranks.arrived.get(2)

        # 3. Stopped, an incident arrives; started again with the same durable consumer it
        # sees only that one: incidents 1 and 2 were acknowledged, never proposed again.
        await example.stop()
        resolved = incident(job, 1, rank=3, ratio=1.0, state=IncidentState.RESOLVED)
        await bus.jetstream.publish(subjects.incident(job), resolved)
        example = await start_example(settings, job, durable)
        skipped = await wait_for(lambda: example.events("skip"), timeout=20, what="skip")
        assert skipped[0]["incident"] == f"{job}-i1" and "resolved" in skipped[0]["why"]
        assert [e["event"] for e in example.lines] == ["ready", "skip"]
    finally:
        await example.stop()
        await ranks.close()
        with contextlib.suppress(Exception):
            await bus.nc.jetstream().delete_consumer(INCIDENT_STREAM, durable)
