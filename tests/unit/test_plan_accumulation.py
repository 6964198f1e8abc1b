"""Plans with micro-batches and gradient accumulation: the schema's relation, the split
into micro-batches, micro-batching within memory caps, and the plan guardrails."""

from __future__ import annotations

import random
import re

import pytest
from pydantic import ValidationError

from antdt.schemas import ActionProposal, JobSpec, Plan
from antdt.schemas.plan import check_accumulation, split_batch
from antdt.services.controller.plans import (
    _accumulation_violation,
    accumulation_upper_bounds,
    micro_batching,
    plan_violations,
)

JOB = "p1"
SPEC = JobSpec(job=JOB, world_size=4, dataset_size=1000, shard_size=10, global_batch=64)


@pytest.mark.parametrize(
    ("local", "micro", "accumulation", "error"),
    [
        ((10, 6), (4, 6), (3, 1), None),
        ((10, 6), None, None, None),
        ((0, 16), (0, 16), (1, 1), None),
        ((10, 6), (4, 6), None, "come together"),
        ((10, 6), (5, 6), (3, 1), "rank 0: micro_batch 5 is not ceil(10 / 3)"),
        ((10, 6), (0, 6), (0, 1), "rank 0: accumulation 0 outside [1, 10]"),
        ((2, 6), (1, 6), (3, 1), "rank 0: accumulation 3 outside [1, 2]"),
        ((10, 6), (2, 6), (6, 1), "rank 0: 6 micro-steps where ceil(10 / 2) suffice"),
        ((10, 6), (4,), (3,), "micro_batch has 1 entries for 2 ranks"),
    ],
)
def test_plan_schema_checks_accumulation(
    local: tuple[int, ...],
    micro: tuple[int, ...] | None,
    accumulation: tuple[int, ...] | None,
    error: str | None,
) -> None:
    fields = dict(
        job=JOB,
        version=1,
        local_batch=local,
        micro_batch=micro,
        accumulation=accumulation,
        effective_step=0,
        created_at=0.0,
    )
    if error is None:
        plan = Plan(**fields)  # type: ignore[arg-type]
        for rank, b in enumerate(local):
            parts = plan.micro_batches(rank)
            assert sum(parts) == b and max(parts) == (micro or local)[rank]
        return
    with pytest.raises(ValidationError, match=re.escape(error)):
        Plan(**fields)  # type: ignore[arg-type]
    if len(micro or local) == len(local):
        with pytest.raises(ValidationError):
            ActionProposal(
                proposal_id="y",
                job=JOB,
                source="t",
                local_batch=local,
                micro_batch=micro,
                accumulation=accumulation,
            )


def test_split_batch() -> None:
    assert split_batch(10, 3) == (4, 4, 2)
    assert split_batch(10, 4) == (3, 3, 3, 1)
    assert split_batch(9, 3) == (3, 3, 3)
    assert split_batch(7, 1) == (7,)
    assert split_batch(0, 1) == (0,)


@pytest.mark.parametrize(
    ("local", "caps", "max_accumulation", "expected"),
    [
        ((43, 21), {0: 16, 1: 16}, 16, ((15, 11), (3, 2))),
        ((43, 21), {}, 16, ((43, 21), (1, 1))),
        ((32, 0), {0: 32, 1: 4}, 16, ((32, 0), (1, 1))),
        ((33, 5), {0: 32}, 16, ((17, 5), (2, 1))),
    ],
)
def test_micro_batching(
    local: tuple[int, ...], caps: dict[int, int], max_accumulation: int, expected: tuple
) -> None:
    assert micro_batching(local, caps, max_accumulation) == expected


def test_micro_batching_refuses_too_many_steps() -> None:
    with pytest.raises(ValueError, match="rank 0: batch 40 needs 5 micro-steps"):
        micro_batching((40,), {0: 8}, 4)
    assert accumulation_upper_bounds(3, 100, 60, {0: 8, 1: 2}, 4) == (32, 8, 60)


def test_plan_violations_without_accumulation_keep_old_rules() -> None:
    assert plan_violations(SPEC, {}, (16, 16, 16, 16)) == ""
    assert "3 ranks" in plan_violations(SPEC, {}, (32, 16, 16))
    assert "exceeds its memory cap 15" in plan_violations(SPEC, {2: 15}, (16, 16, 16, 16))
    bounded = SPEC.model_copy(update={"max_local_batch": 20})
    assert "rank 0: batch 25 outside [1, 20]" in plan_violations(bounded, {}, (25, 13, 13, 13))


def _reference_violation(
    local: tuple[int, ...], micro: tuple[int, ...] | None, accum: tuple[int, ...] | None
) -> str:
    """What plan_violations said of the accumulation before its one-micro-step shortcut
    (its other rules are apart from it)."""
    try:
        check_accumulation(local, micro, accum)
    except ValueError as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize("seed", range(300))
def test_one_micro_step_plans_are_checked_as_rank_by_rank(seed: int) -> None:
    """Plans near one micro-step per rank (a micro-batch or accumulation changed, one
    missing or short, an empty batch) are judged as check_accumulation judges them."""
    rnd = random.Random(seed)
    n = rnd.choice((1, 4, 4, 4))
    local = [16] * n
    if n > 1 and rnd.random() < 0.5:
        local[0], local[-1] = 0, 32  # an empty batch, the sum kept
    micro: list[int] | None = list(local)
    accum: list[int] | None = [1] * n
    for _ in range(rnd.randint(0, 2)):
        which, rank = rnd.choice(("micro", "accum")), rnd.randrange(n)
        if which == "micro" and micro is not None:
            micro[rank] = rnd.choice((0, 8, 16, 17, 32))
        elif accum is not None:
            accum[rank] = rnd.choice((0, 2, 3, 16))
    if rnd.random() < 0.1:
        micro, accum = (None, accum) if rnd.random() < 0.5 else (micro, None)
    if rnd.random() < 0.1 and accum:
        accum.pop()
    plan = (tuple(local), None if micro is None else tuple(micro))
    accumulation = None if accum is None else tuple(accum)
    assert _accumulation_violation(*plan, accumulation) == _reference_violation(*plan, accumulation)
