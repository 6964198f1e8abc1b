"""The job's healthy reference and per-rank evidence (antdt.services.monitor.reference),
and the sorted multiset the Judge keeps the ranks' levels in (windows.SortedValues)."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from antdt.services.monitor.reference import (
    Evidence,
    ReferenceConfig,
    healthy_reference,
    healthy_reference_sorted,
    rank_level,
)
from antdt.services.monitor.windows import SortedValues

CONFIG = ReferenceConfig()
SLOW = CONFIG.slow_step_weight
NORMAL = CONFIG.normal_step_weight


@pytest.mark.parametrize(
    ("levels", "reference"),
    [
        ([], None),
        ([1.0], None),  # nothing to compare with
        ([1.0, 1.4], 1.0),  # two ranks: the faster one, not their median (1.2)
        ([1.4, 1.0], 1.0),
        ([1.0, 1.0, 1.3], 1.0),  # three: the two fastest
        ([1.0, 1.1, 1.3, 1.3], 1.05),  # four, two slow (one node of two): the two fast
        # eight, the four of one host 1.3x slower: the healthy four's median
        ([1.3, 1.3, 1.3, 1.3, 0.98, 1.0, 1.02, 1.04], 1.01),
        # eight, five slow: still where the healthy three are (the faster half's median)
        ([1.3, 1.3, 1.3, 1.3, 1.3, 0.98, 1.0, 1.02], 1.01),
        # 256, half of them 1.5x slower: the healthy ranks' median of the faster half
        ([1.5] * 128 + [1.0 + i / 1000 for i in range(128)], 1.0635),
    ],
)
def test_healthy_reference_is_where_the_faster_half_is(
    levels: list[float], reference: float | None
) -> None:
    assert healthy_reference(levels) == pytest.approx(reference)
    assert healthy_reference_sorted(sorted(levels)) == pytest.approx(reference)


@pytest.mark.parametrize(
    ("levels", "reference"),
    [
        ([0.5, 1.0, 1.0, 1.02], 1.0),  # four ranks, one leader: not the healthy pace
        ([0.5, 0.52, 1.0, 1.0, 1.02, 1.04], 1.0),  # two leaders of six
        ([0.5, 1.0], 0.5),  # two ranks: the faster one is the pace (the other is slow)
        ([0.9, 1.0, 1.0, 1.3], 0.95),  # 0.9 is no leader at 0.8: the faster half's median
    ],
)
def test_leaders_are_left_out_of_the_reference(levels: list[float], reference: float) -> None:
    """A leader would pull the reference down and make every other rank look slow."""
    assert healthy_reference(levels, leader_at=0.8) == pytest.approx(reference)
    assert healthy_reference(levels) <= reference  # type: ignore[operator]


def test_a_slow_half_cannot_move_the_reference_but_a_whole_job_does() -> None:
    healthy = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99]
    half_slow = [x * (1.3 if i < 4 else 1.0) for i, x in enumerate(healthy)]
    all_slow = [x * 1.3 for x in healthy]
    reference = healthy_reference(healthy)
    assert reference is not None
    assert healthy_reference(half_slow) == pytest.approx(reference, rel=0.02)
    assert healthy_reference(all_slow) == pytest.approx(1.3 * reference)


@pytest.mark.parametrize(
    ("costs", "level"),
    [
        ([1.0], 1.0),
        # a neighbour's hits (1.3-1.5x) in 3 of 8 steps leave the level where the rank is
        ([1.0, 1.4, 1.02, 0.98, 1.5, 1.01, 1.3, 0.99], 0.9975),
        # a rank slow in every step is slow at its level
        ([1.4, 1.45, 1.38, 1.9, 1.42, 1.41, 2.0, 1.39], 1.3975),
    ],
)
def test_rank_level_is_a_low_quantile_of_its_costs(costs: list[float], level: float) -> None:
    assert rank_level(costs, CONFIG) == pytest.approx(level)


@pytest.mark.parametrize(
    ("before", "cost", "after"),
    [
        # a normal step of a rank with no evidence: the same tuple back
        (Evidence(), 1.0, Evidence()),
        (Evidence(), 1.19, Evidence()),
        # a slow step (>= slow_at x the reference) adds ln(p1 / p0)
        (Evidence(), 1.2, Evidence(SLOW, False, 1)),
        (Evidence(), 3.0, Evidence(SLOW, False, 1)),
        # a normal step takes ln((1 - p1) / (1 - p0)) off, never below 0 (and the run ends)
        (Evidence(2 * SLOW, False, 2), 1.0, Evidence(2 * SLOW + NORMAL, False, 3)),
        (Evidence(SLOW, False, 1), 1.0, Evidence()),
        # reaching open_at turns the rank slow; evidence stays capped there
        (Evidence(10.0, False, 9), 1.3, Evidence(10.0 + SLOW, False, 10)),
        (Evidence(11.0, False, 10), 1.3, Evidence(12.0, True, 11)),
        (Evidence(12.0, True, 11), 1.3, Evidence(12.0, True, 12)),
        # hysteresis: slow until the evidence is all gone, not as soon as it dips
        (Evidence(12.0, True, 12), 1.0, Evidence(12.0 + NORMAL, True, 13)),
        (Evidence(1.0, True, 20), 1.0, Evidence()),
    ],
)
def test_evidence_after_a_step(before: Evidence, cost: float, after: Evidence) -> None:
    result = before.after(cost, 1.0, 12.0, CONFIG)
    assert result.slow is after.slow and result.run == after.run
    assert result.score == pytest.approx(after.score)
    if before == after:
        assert result is before


@pytest.mark.parametrize(
    ("before", "ratio", "after"),
    [
        (Evidence(), 1.9, Evidence()),
        (Evidence(3.0, False, 4), 2.0, Evidence(12.0, True, 4)),
        (Evidence(5.0, True, 9), 3.0, Evidence(5.0, True, 9)),
    ],
)
def test_a_window_twice_as_slow_is_slow_at_once(
    before: Evidence, ratio: float, after: Evidence
) -> None:
    assert before.after_window(ratio, 12.0, CONFIG) == after


def test_steps_to_open_grow_with_ln_ranks() -> None:
    """A straggler slow in every step opens after open_at / ln(p1/p0) steps: a dozen at 2
    ranks, a few more at 256, as each rank's false alarms shrink as 1/ranks."""
    opened = {}
    for world in (2, 8, 256):
        evidence, steps = Evidence(), 0
        while not evidence.slow:
            evidence, steps = evidence.after(1.4, 1.0, CONFIG.open_at(world), CONFIG), steps + 1
        opened[world] = steps
    assert opened[2] <= 13 and opened[2] < opened[8] < opened[256] <= 18
    assert CONFIG.open_at(256) - CONFIG.open_at(2) == pytest.approx(math.log(128))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"level_quantile": 1.5},
        {"slow_at": 1.0},
        {"healthy_slow_share": 0.9, "straggler_slow_share": 0.9},
        {"healthy_slow_share": 0.0},
        {"open_base": 0.0},
        {"instant_ratio": 1.1},
    ],
)
def test_config_refuses_nonsense(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ReferenceConfig(**kwargs)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=30), st.data())
def test_sorted_values_median_without(values: list[float], data: st.DataObject) -> None:
    sorted_values = SortedValues()
    for v in values:
        sorted_values.replace(None, v)
    removed = data.draw(st.sampled_from(values))
    rest = list(values)
    rest.remove(removed)
    expected = statistics.median(rest) if rest else None
    assert sorted_values.median_without(removed) == expected
    assert sorted_values.median() == statistics.median(values)
    new = data.draw(st.floats(0.0, 100.0))
    sorted_values.replace(removed, new)
    assert sorted_values.median() == statistics.median([*rest, new])
