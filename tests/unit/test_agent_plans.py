"""Plan selection and the acceptance of commanded plans (pure)."""

from __future__ import annotations

import pytest

from antdt.agent.plans import PlanBook, Verdict, applied_step, prune, select_plan
from antdt.schemas import Plan


def plan(version: int, effective: int, batch: tuple[int, ...] = (4, 4), job: str = "j") -> Plan:
    return Plan(
        job=job, version=version, local_batch=batch, effective_step=effective, created_at=1.0
    )


@pytest.mark.parametrize(
    ("step", "expected"),
    [(0, 0), (9, 0), (10, 1), (19, 1), (20, 3), (25, 3), (1000, 3)],
)
def test_highest_version_whose_effective_step_has_come(step: int, expected: int) -> None:
    # v2 (effective 30) is superseded by v3 (effective 20) and never runs.
    plans = [plan(0, 0), plan(1, 10), plan(2, 30), plan(3, 20)]
    assert select_plan(plans, step).version == expected


def test_before_any_effective_plan_the_earliest_is_used() -> None:
    assert select_plan([plan(5, 40), plan(4, 30)], 0).version == 4
    with pytest.raises(ValueError):
        select_plan([], 0)


def test_prune_keeps_only_plans_that_can_still_run() -> None:
    plans = [plan(0, 0), plan(1, 10), plan(2, 50)]
    assert [p.version for p in prune(plans, 5)] == [0, 1, 2]
    assert [p.version for p in prune(plans, 10)] == [1, 2]
    assert [p.version for p in prune(plans, 60)] == [2]


def test_judge_accepts_newer_refuses_stale_and_bad() -> None:
    book = PlanBook().add(plan(3, 0), 0, 0)
    assert book.judge(plan(4, 5), job="j", world_size=2).verdict is Verdict.ACCEPT
    stale = book.judge(plan(2, 5), job="j", world_size=2)
    assert stale.verdict is Verdict.STALE and "older than 3" in stale.reason
    wrong_world = book.judge(plan(4, 5, (1, 2, 3)), job="j", world_size=2)
    assert wrong_world.verdict is Verdict.BAD and "3 local batches" in wrong_world.reason
    assert book.judge(plan(4, 5, job="k"), job="j", world_size=2).verdict is Verdict.BAD


def test_same_version_is_idempotent_unless_it_differs() -> None:
    book = PlanBook().add(plan(3, 7), 9, 9)
    resent = plan(3, 7).model_copy(update={"created_at": 99.0})
    assert book.judge(resent, job="j", world_size=2).verdict is Verdict.SAME
    assert book.applied_step(resent) == 9
    other = book.judge(plan(3, 7, (2, 6)), job="j", world_size=2)
    assert other.verdict is Verdict.BAD


def test_applied_step_is_never_in_the_past() -> None:
    assert applied_step(plan(1, 10), next_step=4) == 10
    assert applied_step(plan(1, 10), next_step=15) == 15


def test_book_add_prunes_and_remembers_applied_steps() -> None:
    book = PlanBook()
    for version, effective in [(0, 0), (1, 5), (2, 8)]:
        book = book.add(plan(version, effective), effective, current_step=9, agreed=True)
    assert [p.version for p in book.plans] == [2]
    assert book.applied == {2: 8}
    assert book.newest is not None and book.newest.version == 2


def test_a_plan_not_agreed_waits_and_prunes_nothing_it_would_replace() -> None:
    book = PlanBook().add(plan(0, 0), 0, 0, agreed=True)
    book = book.add(plan(1, 5), 5, current_step=9)  # its step has come on this rank only
    assert [p.version for p in book.plans] == [0, 1]
    assert book.select(9).version == 0 and book.agreed == 0
    agreed = book.agree(1, first_open=12)  # every rank holds it: all start it at 12
    assert (agreed.select(11).version, agreed.select(12).version) == (0, 1)
    assert agreed.applied_step(plan(1, 5)) == 12
    assert book.agree(1, first_open=3).applied_step(plan(1, 5)) == 5  # its own, yet to come
    assert agreed.agree(0, first_open=20) is agreed  # an older version changes nothing
    assert book.agree(7, first_open=20) is book  # nor one this rank does not hold
