"""Policy decisions at hundreds of ranks: the same actions as with the per-rank planner
they replaced, and a cost that grows with the ranks, not their square."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from antdt.schemas import RankColumns
from antdt.services.controller.balance import ClassTable
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
    monkeypatch.setattr(targets, "plan_classes", _reference_plan)
    assert load_policy(policy).decide(view, health) == fast
    assert fast  # a 3x straggler: every batch policy acts


def _reference_plan(table: ClassTable, total: int) -> tuple[int, ...]:
    """The per-rank planner on the ranks of `table`."""
    ranks = sum(map(len, table.ranks))
    models: list[Any] = [None] * ranks
    lower, upper = [0] * ranks, [0] * ranks
    for model, members, lo, hi in zip(table.models, table.ranks, table.lo, table.hi, strict=True):
        for rank in members:
            models[rank], lower[rank], upper[rank] = model, lo, hi
    return reference_balanced_batches(models, total, lower, upper)


def test_one_decision_grows_about_linearly_with_the_ranks() -> None:
    """x10 ranks cost well under x100 (the quadratic _kept took x100)."""
    small, large = decision_ms("lb-bsp", 300, repeats=5), decision_ms("lb-bsp", 3000, repeats=5)
    assert large < 40 * max(small, 0.05)


@pytest.mark.parametrize("policy", ["lb-bsp", "antdt-nd", "antdt-dd"])
def test_rows_out_of_rank_order_decide_as_rows_in_order(policy: str) -> None:
    """The row-by-row reading (rows in any order) and the column one (every rank, in
    order) give the same decision."""
    view, health = decision_view(50)
    shuffled = health.model_copy(
        update={"ranks": RankColumns.of_rows(tuple(reversed(health.ranks)))}
    )
    other = replace(view, health=shuffled)
    assert load_policy(policy).decide(other, shuffled) == load_policy(policy).decide(view, health)


def test_a_view_remembers_a_figure_per_key() -> None:
    view, _ = decision_view(4)
    calls: list[int] = []
    for key in (1, 1, 2, 1):
        view.remembered("figure", key, lambda k=key: calls.append(k) or k)  # type: ignore[func-returns-value]
    assert calls == [1, 2]
    assert replace(view).remembered("figure", 1, lambda: -1) == -1  # a new view derives anew


# -- the health as columns, and the planners' class-wise paths ---------------------------------


def test_a_job_record_reads_each_health_into_columns_once() -> None:
    """The controller's job record builds the columns once per health message: every
    decision on that health reads the same ones, a new health gets new ones."""
    from antdt.services.controller.state import JobState

    view, health = decision_view(6)
    state = JobState(spec=view.spec, plan=view.plan, plan_revision=1, health=health)
    first, again = state.view(1.0), state.view(2.0)
    assert first.columns is not None and first.columns is again.columns
    assert first.columns.rates == [r.samples_per_s for r in health.ranks]
    state.health = health.model_copy()
    assert state.view(3.0).columns is not first.columns
    assert first.hosts == {r: f"h{r}" for r in range(6)}


def test_columns_of_another_health_are_not_read() -> None:
    """A view whose columns were read from another health decides on its own health."""
    view, health = decision_view(40)
    slower = health.model_copy(
        update={
            "ranks": RankColumns.of_rows(
                tuple(r.model_copy(update={"per_sample_s": 0.01}) for r in health.ranks)
            )
        }
    )
    stale = replace(view, health=slower)  # columns still those of `health`
    fresh = replace(view, health=slower, columns=None)
    for policy in ("lb-bsp", "antdt-nd", "antdt-dd"):
        assert load_policy(policy).decide(stale, slower) == load_policy(policy).decide(
            fresh, slower
        )
    assert stale.health_columns.health is slower


def test_a_stalled_rank_leaves_the_columns_incomplete() -> None:
    from antdt.schemas import RankColumns, RankState
    from antdt.services.controller.columns import HealthColumns

    _, health = decision_view(5)
    rows = list(health.ranks)
    rows[2] = rows[2].model_copy(update={"state": RankState.STALLED})
    stalled = health.model_copy(update={"ranks": RankColumns.of_rows(tuple(rows))})
    assert HealthColumns.of(health, 5).complete
    assert not HealthColumns.of(stalled, 5).complete
    assert not HealthColumns.of(health, 6).complete  # a rank not heard from


@pytest.mark.parametrize("seed", range(10))
def test_step_time_by_class_is_the_per_rank_one(seed: int) -> None:
    """A target whose ranks mostly share one model predicts as rank by rank, the
    largest batch in a rare rank or none at all included."""
    import random

    from antdt.services.controller.balance import StepModel, classes_of, predicted_step_s

    rng = random.Random(seed)
    n = rng.choice([5, 80, 400])
    common = StepModel(0.002, 1e-3)
    models = [common] * n
    for r in rng.sample(range(n), rng.randint(0, min(n // 2, 150))):
        models[r] = StepModel(rng.choice([0.0, 0.002]), rng.uniform(5e-4, 4e-3))
    if rng.random() < 0.5:
        models[0] = StepModel(0.001, 2e-3)  # the first rank odd: the common model is not its
    classes = classes_of(models, [0] * n, [99] * n)
    plain = targets.Target(tuple([1] * n), tuple(range(n)), None, tuple(models))
    planned = targets.Target(tuple([1] * n), range(n), None, tuple(models), classes)
    for by_class, by_rank in zip(planned.parts, plain.parts, strict=True):
        assert by_class.tolist() == by_rank.tolist()
    for _ in range(20):
        plan = [rng.choice([0, 8, 16, 32]) for _ in range(n)]
        if rng.random() < 0.5:
            plan[rng.randrange(n)] = 99
        assert plain.step_s(plan) == predicted_step_s(models, plan)
        assert planned.step_s(plan) == predicted_step_s(models, plan)


@pytest.mark.parametrize("seed", range(10))
def test_class_plans_move_and_round_as_rank_by_rank(seed: int) -> None:
    """bounded_change of plans with few distinct batches, and proportional shares of
    hundreds of ranks within their bounds: as the references they replaced."""
    import random

    from antdt.services.controller.plans import bounded_change, proportional_shares
    from tests.unit.planning_reference import (
        reference_bounded_change,
        reference_proportional_shares,
    )

    rng = random.Random(seed)
    n = rng.choice([50, 300])
    old = [32] * n
    new = list(old)
    for _ in range(rng.randint(1, 6)):
        a, b = rng.randrange(n), rng.randrange(n)
        moved = rng.randint(0, new[a])
        new[a] -= moved
        new[b] += moved
    for fraction in (0.05, 0.25, 0.5, 8.0):
        assert bounded_change(old, new, fraction) == reference_bounded_change(old, new, fraction)
    speeds = [rng.choice([1.0, 1.001, 0.33, rng.uniform(0.5, 2.0)]) for _ in range(n)]
    expected = reference_proportional_shares(32 * n, speeds, min_b=1)
    assert proportional_shares(32 * n, speeds, min_b=1) == expected


@pytest.mark.parametrize(("ranks", "crowd"), [(400, 0.15), (300, 0.0), (120, 0.5)])
def test_a_healed_plan_from_the_current_classes_is_the_plan_grouped_afresh(
    ranks: int, crowd: float
) -> None:
    """antdt-nd's healed plan (one rank given another model) made from the current
    plan's classes is the plan `classes_of` and the planner make of the healed models:
    for ranks held (a class each), not held, and those `common_model` tries first, given
    a model equal to the others' (one class, then) or another."""
    from antdt.services.controller.balance import StepModel, median_model
    from antdt.services.controller.policies.judged import held_ranks, judged_models, measured_speeds

    view, _ = decision_view(ranks, crowd=crowd)
    models = judged_models(view, measured_speeds(view), held_ranks(view, frozenset()))
    assert models is not None and all(models)
    typical = median_model([m for m in models if m is not None])
    fast = 0
    for rank in sorted({0, 1, ranks // 2, ranks - 2, ranks - 1, *range(0, ranks, 7)}):
        for model in (StepModel(typical.fixed_s, typical.per_sample_s), StepModel(0.001, 4e-4)):
            healed = list(models)
            healed[rank] = model
            got = targets.healed_target(replace(view), models, rank, model)
            want = targets._balanced_target(replace(view), healed)
            assert got is not None and want is not None and want.classes is not None
            assert (got.plan, tuple(got.known), got.models) == (
                want.plan,
                tuple(want.known),
                want.models,
            )
            assert got.classes is not None and got.planned_step_s == want.planned_step_s
            table, wanted = got.classes, want.classes
            assert (table.ranks, table.lo, table.hi) == (wanted.ranks, wanted.lo, wanted.hi)
            assert all(a is b for a, b in zip(table.models, wanted.models, strict=True))
            now = targets.balanced_target(view, models)
            fast += now is not None and targets._own_class(now, rank, model) is not None
    # A held rank is a class of its own; half the ranks slow leave no model to most.
    assert bool(fast) is (crowd < 0.5)
