"""ActionProposals against the real controller, nats-server and etcd, with stand-in ranks
acking commands: applied once (idempotent by proposal id), bad proposals refused with
their reason and nothing applied, an ack signed by the wrong rank not counted."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from antdt.runtime.bus import Bus, RequestRefused
from antdt.runtime.config import ServiceSettings
from antdt.schemas import (
    ACTION_STREAM,
    ActionProposal,
    ActionRecord,
    ActionResult,
    JobSpec,
    Plan,
    PlanRequest,
    RegisterReply,
    Subjects,
)
from antdt.testing import acking_ranks, signed_by_another
from tests.e2e.conftest import RunningServices, start_services
from tests.helpers import refusal
from tests.policyproc import announce_cap

pytestmark = pytest.mark.integration
WORLD, BATCH = 4, 64


@pytest.fixture
async def controller(settings: ServiceSettings) -> AsyncIterator[RunningServices]:
    # Long enough that a stalled machine does not turn the ranks' real acks into missing ones.
    running = await start_services(settings, ("controller",), ack_deadline_s=2.5)
    yield running
    await running.runtime.shutdown()


async def register(bus: Bus, job: str, **params: float) -> None:
    spec = JobSpec(
        job=job,
        world_size=WORLD,
        dataset_size=1000,
        shard_size=10,
        global_batch=BATCH,
        policy_params=params,
    )
    await bus.request(Subjects(bus.settings.subject_prefix).register(job), spec, RegisterReply)


async def current_plan(bus: Bus, job: str) -> Plan:
    subjects = Subjects(bus.settings.subject_prefix)
    return await bus.request(subjects.plan_get(job), PlanRequest(job=job, rank=0), Plan)


def proposal(job: str, local: tuple[int, ...], pid: str = "p1", **kw: object) -> ActionProposal:
    return ActionProposal(
        proposal_id=pid,
        job=job,
        source="test-policy",
        local_batch=local,
        reason="test: move samples off rank 3",
        **kw,
    )  # type: ignore[arg-type]


async def propose(bus: Bus, p: ActionProposal) -> ActionRecord:
    subject = Subjects(bus.settings.subject_prefix).proposal(p.job)
    return await bus.request(subject, p, ActionRecord, timeout=10.0)


async def test_proposal_applied_once_on_every_rank(controller: RunningServices, bus: Bus) -> None:
    job = "prop-ok"
    await register(bus, job)
    ranks = await acking_ranks(bus.settings, job, WORLD).start()
    try:
        p = proposal(job, (20, 20, 20, 4), plan_version=0, incident_id="inc-1")
        record = await propose(bus, p)
        assert record.result == ActionResult.APPLIED and record.plan_version == 1
        assert record.acked_ranks == (0, 1, 2, 3) and record.policy == "proposal:test-policy"
        assert record.incident_id == "inc-1" and record.local_batch == (20, 20, 20, 4)
        await ranks.wait_version(1)
        assert {ranks.plans[r][1].local_batch for r in range(WORLD)} == {(20, 20, 20, 4)}
        stored = await current_plan(bus, job)
        assert stored.version == 1 and stored.policy == "proposal:test-policy"
        # The same proposal again (a retry after a lost reply): the same answer, no new plan.
        commands = ranks.commands
        assert await propose(bus, p) == record
        assert (await current_plan(bus, job)).version == 1 and ranks.commands == commands
    finally:
        await ranks.close()


async def test_bad_proposals_refused_with_reasons(controller: RunningServices, bus: Bus) -> None:
    job = "prop-bad"
    subjects = Subjects(bus.settings.subject_prefix)
    await register(bus, job)
    ranks = await acking_ranks(bus.settings, job, WORLD).start()
    await announce_cap(bus, controller.by_name["controller"].jobs, job, WORLD, rank=0, cap=18)
    refused: list[tuple[ActionProposal, str, str]] = [
        (proposal("nope", (16, 16, 16, 16)), "unknown_job", "job 'nope' is not registered"),
        (proposal(job, (16, 16, 16, 8, 8)), "unknown_rank", "job prop-bad has ranks 0..3"),
        (proposal(job, (17, 17, 17, 13), plan_version=3), "stale", "the job's plan is version 0"),
        (proposal(job, (20, 16, 16, 12)), "guardrail", "rank 0: batch 20 exceeds its memory cap"),
        (proposal(job, (18, 18, 18, 18)), "guardrail", "plan sums to 72, global batch is 64"),
        (proposal(job, (16, 16, 16, 16)), "no_change", "running now"),
    ]
    try:
        for p, code, reason in refused:
            with pytest.raises(RequestRefused) as caught:
                await propose(bus, p)
            assert caught.value.reply.code == code and reason in caught.value.reply.error, p
        good = proposal(job, (17, 17, 17, 13)).model_dump()
        malformed = [
            b"{not json",
            json.dumps({**good, "surprise": 1}).encode(),
            json.dumps({**good, "local_batch": [17, 17, -1, 31]}).encode(),
            json.dumps(
                {**good, "micro_batch": [9, 17, 17, 13], "accumulation": [3, 1, 1, 1]}
            ).encode(),
            json.dumps({**good, "job": "other-job"}).encode(),
        ]
        for raw in malformed:
            answer = await refusal(bus, subjects.proposal(job), raw, ActionRecord)
            assert answer.code == "bad_request" and answer.error, raw
        assert (await current_plan(bus, job)).version == 0 and ranks.commands == 0
        replay = await bus.jetstream.read(ACTION_STREAM, subjects.action(job), ActionRecord)
        errors = [r.error or "" for r in replay.items if r.result == ActionResult.REFUSED]
        assert len(errors) == 5  # every refusal by the owner is recorded, with its reason
        assert any("exceeds its memory cap 18" in e for e in errors)
        assert any(e.startswith("stale: ") for e in errors)
    finally:
        await ranks.close()


async def test_ack_from_the_wrong_rank_is_not_counted(
    controller: RunningServices, bus: Bus
) -> None:
    job = "prop-wrong-ack"
    await register(bus, job)
    ranks = await acking_ranks(bus.settings, job, WORLD, hook=signed_by_another({2}, WORLD)).start()
    try:
        record = await propose(bus, proposal(job, (20, 20, 20, 4), plan_version=0))
        assert record.result == ActionResult.PARTIAL
        assert record.acked_ranks == (0, 1, 3) and record.missing_ranks == (2,)
        assert (await current_plan(bus, job)).version == 1  # written; rank 2 never confirmed
    finally:
        await ranks.close()
