"""Plan arithmetic: exact sums, bounds, bounded change, predicted step time."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from antdt.schemas import Plan
from antdt.services.controller.plans import (
    bounded_change,
    check_feasible,
    next_plan,
    predicted_step_time,
    proportional_shares,
    upper_bounds,
)
from antdt.services.controller.policies import AdjustBatchAction
from antdt.services.controller.splits import ints


@pytest.mark.parametrize(
    ("global_batch", "speeds", "kwargs", "expected"),
    [
        (10, [1, 1, 1], {}, (4, 3, 3)),
        (128, [1, 1, 1, 1 / 3], {}, (39, 38, 38, 13)),
        (128, [3, 3, 3, 1], {}, (39, 38, 38, 13)),
        (100, [1, 1, 1, 1], {"caps": {0: 10}}, (10, 30, 30, 30)),
        (100, [1, 1, 1, 1], {"caps": {0: 20, 1: 20, 2: 20}}, (20, 20, 20, 40)),
        (100, [1, 1, 1, 1], {"max_b": 30, "caps": {3: 50}}, (25, 25, 25, 25)),
        (10, [100, 1], {"min_b": 2}, (8, 2)),
        (7, [1], {}, (7,)),
        (0, [1, 2], {}, (0, 0)),
    ],
)
def test_proportional_shares(
    global_batch: int, speeds: list[float], kwargs: dict, expected: tuple[int, ...]
) -> None:
    assert proportional_shares(global_batch, speeds, **kwargs) == expected


@pytest.mark.parametrize(
    ("global_batch", "speeds", "kwargs", "message"),
    [
        (10, [1, 1], {"min_b": 6}, "minimum batches sum to 12"),
        (100, [1, 1], {"max_b": 40}, "hold at most 80"),
        (100, [1, 1], {"caps": {0: 10, 1: 10}}, "hold at most 20"),
        (10, [1, 1], {"min_b": 4, "caps": {1: 3}}, "rank 1: largest batch 3"),
        (10, [1, 0], {}, "positive and finite"),
        (10, [1, math.nan], {}, "positive and finite"),
        (10, [], {}, "at least one rank"),
    ],
)
def test_infeasible_shares_say_why(
    global_batch: int, speeds: list[float], kwargs: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        proportional_shares(global_batch, speeds, **kwargs)


@st.composite
def share_problems(draw: st.DrawFn) -> tuple[int, list[float], int, int | None, dict[int, int]]:
    n = draw(st.integers(1, 12))
    speeds = draw(st.lists(st.floats(0.01, 1e4), min_size=n, max_size=n))
    min_b = draw(st.integers(0, 8))
    global_batch = draw(st.integers(0, 600))
    max_b = draw(st.none() | st.integers(1, 300))
    caps = draw(st.dictionaries(st.integers(0, n - 1), st.integers(1, 300), max_size=n))
    return global_batch, speeds, min_b, max_b, caps


@settings(max_examples=200, deadline=None)
@given(share_problems())
def test_shares_sum_exactly_within_bounds_or_refuse(
    problem: tuple[int, list[float], int, int | None, dict[int, int]],
) -> None:
    global_batch, speeds, min_b, max_b, caps = problem
    upper = upper_bounds(len(speeds), global_batch, max_b, caps)
    lower = [min_b] * len(speeds)
    try:
        check_feasible(global_batch, lower, upper)
    except ValueError:
        with pytest.raises(ValueError):
            proportional_shares(global_batch, speeds, min_b, max_b, caps)
        return
    shares = proportional_shares(global_batch, speeds, min_b, max_b, caps)
    assert sum(shares) == global_batch
    assert all(lo <= b <= hi for b, lo, hi in zip(shares, lower, upper, strict=True))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.01, 1e4), min_size=1, max_size=12), st.integers(0, 5000))
def test_unbounded_shares_are_proportional_and_monotonic(
    speeds: list[float], global_batch: int
) -> None:
    shares = proportional_shares(global_batch, speeds)
    total = sum(speeds)
    for b, s in zip(shares, speeds, strict=True):
        assert abs(b - global_batch * s / total) < 1.0 + 1e-6
    for i in range(len(speeds)):
        for j in range(len(speeds)):
            if speeds[i] > speeds[j] * (1 + 1e-9):
                assert shares[i] >= shares[j]


@pytest.mark.parametrize(
    ("old", "new", "max_fraction", "expected"),
    [
        ((32, 32, 32, 32), (39, 38, 38, 13), 0.75, (39, 38, 38, 13)),  # 3x fixed in one
        ((32, 32, 32, 32), (39, 38, 38, 13), 0.25, (35, 35, 34, 24)),
        ((10, 10), (10, 10), 0.1, (10, 10)),
        ((1, 99), (50, 50), 0.1, (6, 94)),  # a starved rank grows by 10% of the mean
        ((0, 4), (4, 0), 0.01, (1, 3)),  # at least one sample moves
        ((32, 32), (60, 4), math.inf, (60, 4)),
    ],
)
def test_bounded_change(
    old: tuple[int, ...], new: tuple[int, ...], max_fraction: float, expected: tuple[int, ...]
) -> None:
    assert bounded_change(old, new, max_fraction) == expected


def test_bounded_change_rejects_mismatched_plans() -> None:
    with pytest.raises(ValueError):
        bounded_change((1, 2), (2, 2), 0.5)
    with pytest.raises(ValueError):
        bounded_change((1, 2), (3,), 0.5)
    with pytest.raises(ValueError):
        bounded_change((1, 2), (2, 1), 0.0)


@st.composite
def plan_pairs(draw: st.DrawFn) -> tuple[list[int], list[int], float]:
    n = draw(st.integers(1, 10))
    old = draw(st.lists(st.integers(0, 200), min_size=n, max_size=n))
    assume(sum(old) > 0)
    weights = draw(st.lists(st.floats(0.01, 100), min_size=n, max_size=n))
    new = list(proportional_shares(sum(old), weights))
    return old, new, draw(st.floats(0.01, 2.0))


@settings(max_examples=200, deadline=None)
@given(plan_pairs())
def test_bounded_change_keeps_sum_limits_and_direction(
    pair: tuple[list[int], list[int], float],
) -> None:
    old, new, max_fraction = pair
    moved = bounded_change(old, new, max_fraction)
    assert sum(moved) == sum(old)
    mean = sum(old) / len(old)
    for a, b, m in zip(old, new, moved, strict=True):
        assert min(a, b) <= m <= max(a, b)  # towards the target, never past it
        assert abs(m - a) <= max(1, math.floor(max_fraction * max(a, mean)))


@pytest.mark.parametrize(
    ("batch", "speeds", "expected"),
    [
        ((32, 32, 32, 32), (1000, 1000, 1000, 1000 / 3), 0.096),
        ((39, 38, 38, 13), (1000, 1000, 1000, 1000 / 3), 0.039),
        ((0, 10), (0.0, 100.0), 0.1),  # an idle rank does not count
        ((5, 10), (0.0, 100.0), math.inf),
        ((5, 10), (math.nan, 100.0), math.inf),  # nor does a rank of no speed end
        ((0, 0), (1.0, 2.0), 0.0),
        ((), (), 0.0),
    ],
)
def test_predicted_step_time(
    batch: tuple[int, ...], speeds: tuple[float, ...], expected: float
) -> None:
    assert predicted_step_time(batch, speeds) == pytest.approx(expected)


def test_next_plan_bumps_the_version() -> None:
    plan = Plan(job="j", version=4, local_batch=(4, 4), effective_step=10, created_at=1.0)
    action = AdjustBatchAction("j-plan-5", (6, 2), "why" * 300)
    nxt = next_plan(plan, action, policy="none", effective_step=20, now=99.0)
    assert (nxt.version, nxt.local_batch, nxt.effective_step) == (5, (6, 2), 20)
    assert (nxt.created_at, nxt.policy, len(nxt.reason)) == (99.0, "none", 512)
    assert (nxt.micro_batch, nxt.accumulation) == (None, None)


@pytest.mark.parametrize("seed", range(20))
def test_bounded_change_in_integers_moves_as_in_fractions(seed: int) -> None:
    """Same moves as the Fraction arithmetic it replaced (tests/unit/planning_reference.py)."""
    import random

    from tests.unit.planning_reference import reference_bounded_change

    rng = random.Random(seed)
    for _ in range(200):
        n = rng.randint(1, 12)
        old = [rng.randint(0, 60) for _ in range(n)]
        new = [0] * n
        for _ in range(sum(old)):
            new[rng.randrange(n)] += 1
        fraction = rng.choice([0.01, 0.1, 0.25, 1 / 3, 0.5, 0.75, 1.0, 2.0])
        assert bounded_change(old, new, fraction) == reference_bounded_change(old, new, fraction)


@pytest.mark.parametrize("seed", range(20))
def test_proportional_shares_at_c_speed_split_as_rank_by_rank(seed: int) -> None:
    """Same shares as the rank-by-rank water-filling and rounding they replaced
    (tests/unit/planning_reference.py), bounds pinning ranks on either side."""
    import random

    from tests.unit.planning_reference import reference_proportional_shares

    rng = random.Random(seed)
    for _ in range(100):
        n = rng.randint(1, 40)
        speeds = [rng.choice([1.0, 2.0, rng.uniform(0.1, 10.0)]) for _ in range(n)]
        min_b = rng.choice([0, 1, 4])
        caps = {r: rng.randint(min_b, 64) for r in range(n) if rng.random() < 0.3}
        top = sum(caps.get(r, 64) for r in range(n))
        total = rng.randint(min_b * n, max(min_b * n, top))
        try:
            expected = reference_proportional_shares(total, speeds, min_b, 64, caps)
        except ValueError:
            with pytest.raises(ValueError):
                proportional_shares(total, speeds, min_b, 64, caps)
            continue
        assert proportional_shares(total, speeds, min_b, 64, caps) == expected


def test_a_global_batch_the_planners_cannot_split_exactly_is_refused() -> None:
    """The planners split the global batch in 64-bit integer arrays, where the bounded
    move multiplies two batches: a job spec over 2**31 - 1 samples a step is refused
    with the field and why, not planned wrong."""
    from pydantic import ValidationError

    from antdt.schemas import JobSpec

    fields = {"job": "big", "world_size": 2, "dataset_size": 10, "shard_size": 1}
    assert JobSpec(**fields, global_batch=2**31 - 1).global_batch == 2**31 - 1
    with pytest.raises(ValidationError, match="global_batch"):
        JobSpec(**fields, global_batch=2**31)
    from tests.unit.planning_reference import reference_bounded_change

    old, new = (2**30, 2**31 - 1 - 2**30), (2**31 - 2, 1)  # about the largest move there is
    for fraction in (0.5, 0.3, 1e-9):
        assert bounded_change(old, new, fraction) == reference_bounded_change(old, new, fraction)


def _feasibility_rank_by_rank(global_batch: int, lower: list[int], upper: list[int]) -> str:
    """What `check_feasible` says, checked rank by rank ('' when a plan fits)."""
    for rank, (lo, hi) in enumerate(zip(lower, upper, strict=True)):
        if hi < lo:
            return f"rank {rank}: largest batch {hi} is below the smallest {lo}"
    if sum(lower) > global_batch:
        return f"minimum batches sum to {sum(lower)} > global batch {global_batch}"
    if sum(upper) < global_batch:
        return f"ranks hold at most {sum(upper)} samples"
    return ""


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 200),
    st.integers(1, 8),
    st.lists(st.integers(0, 30), min_size=1, max_size=2),
    st.lists(st.integers(0, 30), min_size=1, max_size=2),
)
def test_feasibility_of_one_bound_for_all_is_read_as_rank_by_rank(
    global_batch: int, n: int, lows: list[int], highs: list[int]
) -> None:
    """Bounds of one value for every rank are checked at C speed: the same verdict and
    message as rank by rank, and bounds that differ between ranks still checked each."""
    lower = [lows[r % len(lows)] for r in range(n)]
    upper = [highs[r % len(highs)] for r in range(n)]
    expected = _feasibility_rank_by_rank(global_batch, lower, upper)
    if not expected:
        check_feasible(global_batch, lower, upper)
        return
    with pytest.raises(ValueError) as refused:
        check_feasible(global_batch, lower, upper)
    assert str(refused.value).startswith(expected)


@pytest.mark.parametrize(
    "values",
    [(), (5,), (7, 7, 7), [2**31 - 1] * 4, (3, 3, 4), [0, 1, 1], np.array([4, 4, 4])],
    ids=["empty", "one", "same", "largest", "differ-last", "differ-first", "array"],
)
def test_ints_of_one_value_throughout_equal_those_read_one_by_one(values: Sequence[int]) -> None:
    made = ints(values)
    assert made.dtype == np.int64
    assert made.tolist() == [int(v) for v in values]
