"""One policy decision of every built-in policy at 100, 1,000 and 10,000 ranks (the
bench's rows, bench/decisions.py): each grows about linearly with the ranks, and stays
within a bound at 10,000 that a loaded two-core CI machine keeps (CI_BOUND_MS)."""

from __future__ import annotations

import pytest

from bench.decisions import CROWD, POLICIES, RANK_COUNTS, TARGET_MS, bench_rows, decision_rows

#: The bench's target is TARGET_MS (make bench flags a row over it); here a bound that a
#: loaded two-core CI machine keeps (4-12 ms measured on one, health read into columns),
#: far below the 1-4 s a quadratic step took.
CI_BOUND_MS = 5 * TARGET_MS
#: The same with 15% of the ranks persistently slow (5-45 ms measured on one; 12-100 ms
#: before the planners ran in arrays): antdt-nd planned the job once per straggler
#: there, seconds a decision.
CROWDED_CI_BOUND_MS = 15 * TARGET_MS


@pytest.fixture(scope="module")
def rows() -> list[dict[str, object]]:
    return decision_rows(repeats=3)


def test_every_policy_is_timed_at_every_rank_count(rows: list[dict[str, object]]) -> None:
    assert [(r["policy"], r["ranks"], r["crowd"]) for r in rows] == [
        (p, n, crowd) for crowd in (0.0, CROWD) for p in POLICIES for n in RANK_COUNTS
    ]
    assert [r["what"] for r in bench_rows(rows)] == [
        f"one {p} decision at 10,000 ranks, CPU µs" for p in POLICIES
    ] + [f"one {p} decision at 10,000 ranks, 15% of them slow, CPU µs" for p in POLICIES]


@pytest.mark.parametrize("policy", POLICIES)
def test_one_decision_at_10000_ranks_is_fast_and_about_linear(
    rows: list[dict[str, object]], policy: str
) -> None:
    ms = _ms(rows, policy, 0.0)
    assert ms[10_000] < CI_BOUND_MS
    # 100x the ranks: at most ~100x the time (a quadratic step took 10,000x)
    assert ms[10_000] <= 200 * max(ms[100], 0.02)


@pytest.mark.parametrize("policy", POLICIES)
def test_one_decision_with_a_crowd_of_stragglers_is_about_linear(
    rows: list[dict[str, object]], policy: str
) -> None:
    ms = _ms(rows, policy, CROWD)
    assert ms[10_000] < CROWDED_CI_BOUND_MS
    assert ms[10_000] <= 200 * max(ms[100], 0.02)


def _ms(rows: list[dict[str, object]], policy: str, crowd: float) -> dict[int, float]:
    return {
        int(str(r["ranks"])): float(str(r["ms"]))
        for r in rows
        if r["policy"] == policy and r["crowd"] == crowd
    }


def test_the_health_is_read_into_columns_about_linearly(rows: list[dict[str, object]]) -> None:
    """The once-per-health cost the decisions leave out is reported, and linear."""
    reading = {int(str(r["ranks"])): float(str(r["columns_ms"])) for r in rows}
    assert set(reading) == set(RANK_COUNTS)
    assert 0 < reading[10_000] < CI_BOUND_MS
    assert reading[10_000] <= 200 * max(reading[100], 0.02)
