"""Custom-policy proposals: the pure check, table-style with time as a value."""

from __future__ import annotations

from typing import Any

import pytest

from antdt.schemas import ActionProposal, JobHealth, JobSpec, Plan
from antdt.services.controller.policies import JobView
from antdt.services.controller.proposals import (
    Refusal,
    change_violation,
    check_proposal,
    proposal_action_id,
    rails_for,
)

JOB = "p1"
NOW = 5000.0
SPEC = JobSpec(job=JOB, world_size=4, dataset_size=1000, shard_size=10, global_batch=64)


def view(
    *,
    version: int = 2,
    caps: dict[int, int] | None = None,
    last_action_at: float | None = None,
    health_at: tuple[int, int] | None = None,  # (plan_version, step) of the last health
) -> JobView:
    plan = Plan(
        job=JOB,
        version=version,
        local_batch=(16, 16, 16, 16),
        effective_step=50,
        created_at=NOW - 100,
    )
    health = None
    if health_at is not None:
        health = JobHealth(
            job=JOB,
            at=NOW,
            step=health_at[1],
            step_s=0.1,
            samples_per_s=1.0,
            balance_efficiency=1.0,
            plan_version=health_at[0],
            ranks=(),
        )
    return JobView(
        spec=SPEC,
        plan=plan,
        health=health,
        open_incidents=(),
        memory_caps=caps or {},
        last_action_at=last_action_at,
        now=NOW,
    )


def proposal(local: tuple[int, ...] = (20, 20, 20, 4), **fields: Any) -> ActionProposal:
    return ActionProposal(proposal_id="x1", job=JOB, source="test", local_batch=local, **fields)


CASES: list[tuple[str, JobView, ActionProposal, str | None, str]] = [
    ("fine", view(), proposal(plan_version=2), None, ""),
    ("fine without a plan version", view(), proposal(), None, ""),
    (
        "accumulation within the caps",
        view(caps={3: 2}),
        proposal(micro_batch=(20, 20, 20, 2), accumulation=(1, 1, 1, 2)),
        None,
        "",
    ),
    (
        "a rank the job does not have",
        view(),
        proposal((16, 16, 16, 8, 8)),
        "unknown_rank",
        "ranks 4..4: job p1 has ranks 0..3",
    ),
    ("too few ranks", view(), proposal((32, 32)), "bad_request", "2 batches for the 4 ranks"),
    (
        "stale plan version",
        view(),
        proposal(plan_version=1),
        "stale",
        "computed from plan version 1; the job's plan is version 2",
    ),
    (
        "global batch not kept",
        view(),
        proposal((20, 20, 20, 20)),
        "guardrail",
        "plan sums to 80, global batch is 64",
    ),
    (
        "batch beyond a memory cap",
        view(caps={0: 18}),
        proposal(),
        "guardrail",
        "rank 0: batch 20 exceeds its memory cap 18",
    ),
    (
        "micro-batch beyond a memory cap",
        view(caps={0: 9}),
        proposal(micro_batch=(10, 20, 20, 4), accumulation=(2, 1, 1, 1)),
        "guardrail",
        "rank 0: micro-batch 10 exceeds its memory cap 9",
    ),
    (
        "below the job's minimum batch",
        view(),
        proposal((22, 21, 21, 0)),
        "guardrail",
        "rank 3: batch 0 outside [1, 64]",
    ),
    (
        "more change than max_change allows",
        view(),
        proposal((40, 8, 8, 8)),
        "guardrail",
        "rank 0: batch 16 -> 40 moves by 24, more than max_change 0.75 allows (12)",
    ),
    (
        "the plan already running",
        view(),
        proposal((16, 16, 16, 16)),
        "no_change",
        "plan version 2, running now",
    ),
    (
        "cooling down",
        view(last_action_at=NOW - 1.0),
        proposal(),
        "hold",
        "cooling down: last action 1.0s ago, cooldown_s is 3",
    ),
    (
        "current plan not measured",
        view(health_at=(1, 100)),
        proposal(),
        "hold",
        "plan version 2 not measured yet",
    ),
    (
        "settling",
        view(health_at=(2, 52)),
        proposal(),
        "hold",
        "settling after the plan switch: step 52 < 50 + settle_steps 8",
    ),
    ("measured and settled", view(health_at=(2, 58)), proposal(), None, ""),
]


@pytest.mark.parametrize(("name", "v", "p", "code", "reason"), CASES, ids=[c[0] for c in CASES])
def test_check_proposal(
    name: str, v: JobView, p: ActionProposal, code: str | None, reason: str
) -> None:
    refusal = check_proposal(v, p, rails_for(SPEC))  # the common defaults
    if code is None:
        assert refusal is None, name
    else:
        assert isinstance(refusal, Refusal)
        assert (refusal.code, reason in refusal.reason) == (code, True), refusal


def test_change_violation_agrees_with_bounded_change() -> None:
    from antdt.services.controller.plans import bounded_change

    old = (16, 16, 16, 16)
    for new in [(28, 12, 12, 12), (29, 11, 12, 12), (4, 20, 20, 20), (64, 0, 0, 0)]:
        assert (change_violation(old, new, 0.75) == "") == (bounded_change(old, new, 0.75) == new)
    assert change_violation(old, (64, 0, 0, 0), float("inf")) == ""


def test_plan_and_restart_ids_of_the_longest_job_ids_fit_and_stay_apart() -> None:
    from antdt.schemas import AdjustBatch, PendingRestart
    from antdt.services.controller.actions import job_action_id, plan_version_action_id

    assert plan_version_action_id("j", 3) == "j-plan-3"
    one, other = "a" * 127 + "1", "a" * 127 + "2"  # Token allows 128
    ids = {job_action_id(job, what) for job in (one, other) for what in ("plan-7", "restart-2")}
    assert len(ids) == 4 and all(
        len(i) <= 128 and i.endswith(("-plan-7", "-restart-2")) for i in ids
    )
    plan = Plan(job=one, version=7, local_batch=(4, 4), effective_step=9, created_at=1.0)
    AdjustBatch(action_id=plan_version_action_id(one, 7), job=one, plan=plan)  # validates
    restart = job_action_id(one, "restart-2")
    PendingRestart(action_id=restart, rank=0, host="h", checkpoint_step=9, decided_at=1.0)


def test_rails_and_action_ids() -> None:
    params = {"cooldown_s": 0.0, "variant": "cpu"}
    assert rails_for(SPEC.model_copy(update={"policy_params": params})).cooldown_s == 0.0
    unparsable = SPEC.model_copy(update={"policy_params": {"cooldown_s": "x"}})
    assert rails_for(unparsable) == rails_for(SPEC)
    assert proposal_action_id("j", "abc") == "j-proposal-abc"
    long = proposal_action_id("j" * 100, "p" * 100)
    assert len(long) <= 128 and long == proposal_action_id("j" * 100, "p" * 100)
