"""The policy-facing contract against two real controller replicas, nats-server and etcd:
the job's spec and guardrails in force (`spec.get`), the plan for a non-rank, and a typed
error instead of silence for the requests no owner answers (an unknown or ended job), by
whichever replica hears them; bad input gets a typed error too."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import pytest

from antdt.runtime.bus import Bus, RequestRefused
from antdt.runtime.config import ServiceSettings
from antdt.runtime.store import Store
from antdt.schemas import (
    ActionProposal,
    ActionRecord,
    ActionResult,
    JobHealth,
    JobSpec,
    Keys,
    Plan,
    PlanRequest,
    RankHealth,
    RankHello,
    RankState,
    RegisterReply,
    SpecReply,
    SpecRequest,
    Subjects,
)
from antdt.services.controller.guardrails import Guardrails
from antdt.testing import acking_ranks
from tests.e2e.conftest import RunningServices, start_services
from tests.helpers import refusal, wait_for

pytestmark = pytest.mark.integration
WORLD, BATCH = 4, 64


@pytest.fixture
async def controllers(settings: ServiceSettings) -> AsyncIterator[list[RunningServices]]:
    """Two controller replicas of one deployment."""
    other = settings.model_copy(update={"replica_id": f"{settings.replica_id}-b"})
    running = [
        await start_services(s, ("controller",), ack_deadline_s=2.5) for s in (settings, other)
    ]
    yield running
    for replica in running:
        await replica.runtime.shutdown()


def spec(job: str, **params: float | int) -> JobSpec:
    return JobSpec(
        job=job,
        world_size=WORLD,
        dataset_size=1000,
        shard_size=10,
        global_batch=BATCH,
        max_local_batch=30,
        policy_params=params,
    )


def proposal(job: str, local: tuple[int, ...], pid: str = "p1") -> ActionProposal:
    return ActionProposal(
        proposal_id=pid, job=job, source="contract-test", local_batch=local, reason="test"
    )


def ended_health(job: str, step: int) -> JobHealth:
    """The last JobHealth the monitor publishes for a job whose every rank exited."""
    ranks = tuple(
        RankHealth(
            rank=r,
            host=f"h{r}",
            state=RankState.EXITED,
            last_step=step,
            local_batch=16,
            samples_per_s=0.0,
            compute_s_per_sample=0.0,
            ratio=1.0,
            data_wait_share=0.0,
            comm_share=0.0,
        )
        for r in range(WORLD)
    )
    return JobHealth(
        job=job,
        at=time.time(),
        step=step,
        step_s=0.1,
        samples_per_s=0.0,
        balance_efficiency=1.0,
        plan_version=0,
        ranks=ranks,
    )


async def test_spec_get_serves_the_spec_and_the_guardrails_in_force(
    controllers: list[RunningServices], bus: Bus
) -> None:
    subjects, job = Subjects(bus.settings.subject_prefix), "contract-spec"
    await bus.request(subjects.register(job), spec(job, cooldown_s=1.5), RegisterReply)
    hello = RankHello(
        job=job, rank=2, world_size=WORLD, host="h2", pid=1, max_local_batch=20, started_at=1.0
    )
    await bus.publish(subjects.hello(job, 2), hello)
    states = [c.by_name["controller"].jobs for c in controllers]
    await wait_for(
        lambda: any(job in s and s[job].memory_caps.get(2) == 20 for s in states), what="cap"
    )
    # Either replica answers (queue group): the owner from its state, the other from etcd.
    replies = [
        await bus.request(subjects.spec_get(job), SpecRequest(job=job), SpecReply) for _ in range(6)
    ]
    reply = replies[0]
    assert all(r == reply for r in replies)
    defaults = Guardrails()
    assert reply.spec == spec(job, cooldown_s=1.5) and reply.spec.min_local_batch == 1
    assert reply.plan_version == 0 and reply.guardrails_error is None
    assert reply.guardrails.cooldown_s == 1.5
    assert reply.guardrails.max_change == defaults.max_change == 0.75
    assert reply.guardrails.settle_steps == defaults.settle_steps
    assert reply.min_local_batch == (1, 1, 1, 1) and reply.max_local_batch == (30, 30, 20, 30)
    assert reply.memory_caps == (None, None, 20, None)
    assert reply.max_move == (12, 12, 12, 12)  # floor(0.75 x 16) from the even plan


async def test_unparsable_guardrails_are_reported_with_the_defaults_in_force(
    controllers: list[RunningServices], bus: Bus
) -> None:
    subjects, job = Subjects(bus.settings.subject_prefix), "contract-bad-params"
    await bus.request(subjects.register(job), spec(job, max_change=-1.0), RegisterReply)
    reply = await bus.request(subjects.spec_get(job), SpecRequest(job=job), SpecReply)
    assert reply.guardrails_error == "max_change must be > 0"
    assert reply.guardrails.max_change == Guardrails().max_change


async def test_the_plan_for_a_non_rank_and_a_rank_outside_the_job(
    controllers: list[RunningServices], bus: Bus
) -> None:
    subjects, job = Subjects(bus.settings.subject_prefix), "contract-plan"
    await bus.request(subjects.register(job), spec(job), RegisterReply)
    plan = await bus.request(subjects.plan_get(job), PlanRequest(job=job), Plan)
    assert plan.version == 0 and plan.local_batch == (16, 16, 16, 16)
    assert b"rank" not in PlanRequest(job=job).model_dump_json().encode()
    assert await bus.request(subjects.plan_get(job), PlanRequest(job=job, rank=3), Plan) == plan
    with pytest.raises(RequestRefused) as outside:
        await bus.request(subjects.plan_get(job), PlanRequest(job=job, rank=99), Plan)
    assert outside.value.reply.code == "unknown_rank" and "ranks 0..3" in outside.value.reply.error


async def test_bad_input_gets_a_typed_error_from_any_replica(
    controllers: list[RunningServices], settings: ServiceSettings, bus: Bus, store: Store
) -> None:
    subjects, keys = Subjects(settings.nats.subject_prefix), Keys(settings.etcd.key_prefix)
    job = "contract-ended"
    await bus.request(subjects.register(job), spec(job), RegisterReply)
    ranks = await acking_ranks(bus.settings, job, WORLD).start()
    try:
        record = await bus.request(
            subjects.proposal(job), proposal(job, (20, 20, 16, 8)), ActionRecord, timeout=10
        )
        assert record.result is ActionResult.APPLIED
    finally:
        await ranks.close()
    # Every rank exited: the monitor marks the job ended and publishes its last health.
    last = ended_health(job, step=40)
    await store.put(keys.ended(job), last.model_dump_json().encode())
    await bus.publish(subjects.health(job), last)
    await wait_for(lambda: _unowned(store, keys, job), what="the job given up")

    ended = await refusal(
        bus,
        subjects.proposal(job),
        proposal(job, (16, 16, 16, 16), "p2").model_dump_json().encode(),
        ActionRecord,
    )
    assert ended.code == "job_ended" and "step 40" in ended.error
    assert ended.code.action == "give_up"
    unknown = await refusal(
        bus,
        subjects.spec_get("nobody"),
        SpecRequest(job="nobody").model_dump_json().encode(),
        SpecReply,
    )
    assert unknown.code == "unknown_job" and unknown.code.action == "fix"
    surprise = json.dumps({**proposal(job, (17, 17, 17, 13)).model_dump(), "surprise": 1})
    unknown_field = await refusal(bus, subjects.proposal(job), surprise.encode(), ActionRecord)
    assert unknown_field.code == "bad_request" and "surprise" in unknown_field.error
    wrong_job = await refusal(
        bus, subjects.spec_get(job), SpecRequest(job="other").model_dump_json().encode(), SpecReply
    )
    assert wrong_job.code == "bad_request"


async def test_a_proposal_for_a_job_nobody_owns_is_answered_by_the_replica_that_hears_it(
    controllers: list[RunningServices], settings: ServiceSettings, bus: Bus, store: Store
) -> None:
    subjects, keys = Subjects(settings.nats.subject_prefix), Keys(settings.etcd.key_prefix)
    job = "contract-unowned"
    await bus.request(subjects.register(job), spec(job), RegisterReply)
    owners = [c.by_name["controller"].ownership for c in controllers]
    owner = next(o for o in owners if o.owns(job))
    await owner.release(job)  # as a replica gives a job up; nobody has claimed it since
    ranks = await acking_ranks(bus.settings, job, WORLD).start()
    try:
        record = await bus.request(
            subjects.proposal(job), proposal(job, (20, 20, 16, 8)), ActionRecord, timeout=10
        )
    finally:
        await ranks.close()
    assert record.result is ActionResult.APPLIED and record.plan_version == 1
    assert await store.get(keys.owner("controller", job)) is not None


async def _unowned(store: Store, keys: Keys, job: str) -> bool:
    return await store.get(keys.owner("controller", job)) is None
