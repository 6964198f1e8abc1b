"""The controller's decision budget per job: a token bucket of CPU seconds, time passed
in. A job's incident decisions may take `share` of a core on average and `burst_s` at
once; past that its transitions are deferred to its health decisions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from antdt.services.controller.decisionbudget import DecisionBudget


def test_a_job_decides_until_its_burst_is_spent_then_waits_for_its_share() -> None:
    budget = DecisionBudget(share=0.25, burst_s=0.1)
    assert budget.allows("j", 100.0)
    budget.spend("j", 100.0, 0.06)
    assert budget.allows("j", 100.0)
    budget.spend("j", 100.0, 0.06)  # 0.02 s owed: a decision is never cut short
    assert not budget.allows("j", 100.0)
    assert budget.left_s("j", 100.0) == pytest.approx(-0.02)
    assert not budget.allows("j", 100.07)  # 0.25 x 0.07 = 0.0175 < 0.02
    assert budget.allows("j", 100.09)
    assert budget.left_s("j", 1000.0) == 0.1  # never more than the burst
    assert budget.allows("other", 100.0)  # each job its own bucket


def test_a_clock_that_steps_back_fills_nothing_and_forget_starts_afresh() -> None:
    budget = DecisionBudget(share=0.5, burst_s=0.1)
    budget.spend("j", 10.0, 0.2)
    assert budget.left_s("j", 5.0) == pytest.approx(-0.1)
    assert budget.left_s("j", 10.1) == pytest.approx(-0.05)
    budget.forget("j")
    assert budget.left_s("j", 10.1) == 0.1


def test_deferred_transitions_are_counted_until_the_next_incident_decision() -> None:
    budget = DecisionBudget(share=0.25, burst_s=0.1)
    assert budget.decided("j", 0.0) == 0
    assert [budget.defer("j", 0.0) for _ in range(3)] == [1, 2, 3]
    assert budget.decided("j", 1.0) == 3
    assert budget.defer("j", 1.0) == 1


@pytest.mark.parametrize(("share", "burst_s"), [(0.0, 1.0), (1.5, 1.0), (0.5, 0.0)])
def test_a_share_outside_0_to_1_or_no_burst_is_refused(share: float, burst_s: float) -> None:
    with pytest.raises(ValueError, match=r"share|burst_s"):
        DecisionBudget(share, burst_s)


def test_buckets_are_kept_for_a_bounded_number_of_jobs() -> None:
    budget = DecisionBudget(share=0.25, burst_s=0.1, limit=2)
    for job in ("a", "b", "c"):
        budget.spend(job, 0.0, 1.0)
    assert budget.allows("a", 0.0)  # forgotten: full again
    assert not budget.allows("c", 0.0)


@given(
    share=st.floats(0.01, 1.0),
    burst_s=st.floats(0.001, 1.0),
    decisions=st.lists(
        st.tuples(st.floats(0.0, 0.5), st.floats(0.0, 0.2)), min_size=1, max_size=200
    ),
)
def test_decisions_allowed_take_at_most_the_burst_and_the_share_of_the_time(
    share: float, burst_s: float, decisions: list[tuple[float, float]]
) -> None:
    """Whatever the decisions cost and however they come, what the allowed ones took is
    at most burst_s + share x the time passed + the last one's cost (one may overdraw)."""
    budget, now, spent, largest = DecisionBudget(share, burst_s), 0.0, 0.0, 0.0
    for wait_s, cpu_s in decisions:
        now += wait_s
        if budget.allows("j", now):
            budget.spend("j", now, cpu_s)
            spent += cpu_s
            largest = max(largest, cpu_s)
    assert spent <= burst_s + share * now + largest + 1e-9
