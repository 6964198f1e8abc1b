"""Policy decisions at hundreds of ranks: the same actions as with the per-rank planner
they replaced, and a cost that grows with the ranks, not their square."""

from __future__ import annotations

from dataclasses import replace

import pytest

from antdt.services.controller.policies import load_policy, targets
from bench.decisions import decision_ms, decision_view
from tests.unit.planning_reference import reference_balanced_batches


@pytest.mark.parametrize("policy", ["lb-bsp", "antdt-nd", "antdt-dd"])
@pytest.mark.parametrize("ranks", [3, 64, 500])
def test_decisions_match_the_per_rank_planner(
    policy: str, ranks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    view, health = decision_view(ranks)
    fast = load_policy(policy).decide(view, health)
    monkeypatch.setattr(targets, "balanced_batches", reference_balanced_batches)
    assert load_policy(policy).decide(view, health) == fast
    assert fast  # a 3x straggler: every batch policy acts


def test_one_decision_grows_about_linearly_with_the_ranks() -> None:
    """x10 ranks cost well under x100 (the quadratic _kept took x100)."""
    small, large = decision_ms("lb-bsp", 300, repeats=5), decision_ms("lb-bsp", 3000, repeats=5)
    assert large < 40 * max(small, 0.05)


@pytest.mark.parametrize("policy", ["lb-bsp", "antdt-nd", "antdt-dd"])
def test_rows_out_of_rank_order_decide_as_rows_in_order(policy: str) -> None:
    """The row-by-row reading (rows in any order) and the column one (every rank, in
    order) give the same decision."""
    view, health = decision_view(50)
    shuffled = health.model_copy(update={"ranks": tuple(reversed(health.ranks))})
    other = replace(view, health=shuffled)
    assert load_policy(policy).decide(other, shuffled) == load_policy(policy).decide(view, health)


def test_a_view_remembers_a_figure_per_key() -> None:
    view, _ = decision_view(4)
    calls: list[int] = []
    for key in (1, 1, 2, 1):
        view.remembered("figure", key, lambda k=key: calls.append(k) or k)  # type: ignore[func-returns-value]
    assert calls == [1, 2]
    assert replace(view).remembered("figure", 1, lambda: -1) == -1  # a new view derives anew
