"""Batches that equalise predicted step times (antdt.services.controller.balance)."""

from __future__ import annotations

import itertools
import random
from typing import NamedTuple

import pytest

from antdt.services.controller.balance import (
    StepModel,
    balanced_batches,
    predicted_step_s,
    step_models,
)
from antdt.services.monitor.speed import SpeedModel


class Model(NamedTuple):
    fixed_s: float
    per_sample_s: float


HEALTHY = Model(0.032, 0.001)
SLOW = Model(0.032 * 1.4, 0.001 * 1.4)  # a noisy neighbour slows both parts


@pytest.mark.parametrize(
    ("models", "total", "lower", "upper", "batches"),
    [
        # equal ranks: equal shares, the remainder to the lower ranks
        ([HEALTHY] * 4, 128, [1] * 4, [128] * 4, (32, 32, 32, 32)),
        ([HEALTHY] * 3, 100, [1] * 3, [100] * 3, (34, 33, 33)),
        # no fixed part: shares proportional to speed (what lb-bsp does today)
        ([Model(0, 0.001), Model(0, 0.002)], 90, [1, 1], [90, 90], (60, 30)),
        # a fixed part: the slow rank keeps its fixed cost whatever its batch, so it gets
        # fewer samples than proportional shares (which would give it 24 of 128)
        ([HEALTHY, HEALTHY, HEALTHY, SLOW], 128, [1] * 4, [128] * 4, (37, 37, 37, 17)),
        # bounds hold: the slow rank cannot go below 24, the others take the rest
        ([HEALTHY, HEALTHY, HEALTHY, SLOW], 128, [24] * 4, [128] * 4, (35, 35, 34, 24)),
        # a memory cap pins a fast rank
        ([Model(0, 0.001), Model(0, 0.002)], 90, [1, 1], [50, 90], (50, 40)),
        # a rank of unknown speed keeps its batch: lower = upper = its batch
        ([HEALTHY, SLOW, HEALTHY], 96, [1, 32, 1], [96, 32, 96], (32, 32, 32)),
        # exact bounds: the only plan
        ([HEALTHY, SLOW], 10, [4, 6], [4, 6], (4, 6)),
    ],
)
def test_balanced_batches(
    models: list[Model],
    total: int,
    lower: list[int],
    upper: list[int],
    batches: tuple[int, ...],
) -> None:
    plan = balanced_batches(models, total, lower, upper)
    assert plan == batches
    assert sum(plan) == total
    assert all(lo <= b <= hi for b, lo, hi in zip(plan, lower, upper, strict=True))


@pytest.mark.parametrize("seed", range(40))
def test_no_integer_plan_has_a_faster_slowest_rank(seed: int) -> None:
    """Against every plan of 3 ranks within the bounds (exhaustive)."""
    rng = random.Random(seed)
    models = [Model(rng.uniform(0, 0.05), rng.uniform(0.0005, 0.003)) for _ in range(3)]
    lower = [rng.randint(0, 5) for _ in range(3)]
    upper = [lo + rng.randint(0, 40) for lo in lower]
    total = rng.randint(sum(lower), sum(upper))
    plan = balanced_batches(models, total, lower, upper)
    best = min(
        predicted_step_s(models, candidate)
        for candidate in itertools.product(
            *(range(lo, hi + 1) for lo, hi in zip(lower, upper, strict=True))
        )
        if sum(candidate) == total
    )
    assert sum(plan) == total
    assert predicted_step_s(models, plan) == pytest.approx(best)


def test_the_monitors_fitted_models_plan_directly() -> None:
    """The monitor's SpeedModel is a StepTimeModel: no conversion between the services."""
    models = [SpeedModel(0.032, 0.001, 2)] * 3 + [SpeedModel(0.0448, 0.0014, 2)]
    assert balanced_batches(models, 128, [1] * 4, [128] * 4) == (37, 37, 37, 17)


def test_one_plan_reaches_what_per_sample_shares_chase() -> None:
    """Per-sample shares, measured at the plan in force, cut the slow rank 32 -> 25 -> 21
    -> 19 -> 18 -> 17, one move per plan; the model's plan goes to 17 at once."""
    models = [HEALTHY, HEALTHY, HEALTHY, SLOW]
    plan: tuple[int, ...] = (32,) * 4
    chase = []
    for _ in range(5):
        times = [m.fixed_s + m.per_sample_s * b for m, b in zip(models, plan, strict=True)]
        per_sample = [Model(0, t / b) for t, b in zip(times, plan, strict=True)]
        plan = balanced_batches(per_sample, 128, [1] * 4, [128] * 4)
        chase.append(plan[3])
    assert chase == [25, 21, 19, 18, 17]
    assert balanced_batches(models, 128, [1] * 4, [128] * 4)[3] == 17


@pytest.mark.parametrize(
    ("models", "batches", "seconds"),
    [
        ([HEALTHY, SLOW], (32, 32), 0.0448 + 0.0448),
        ([HEALTHY, SLOW], (32, 0), 0.064),  # a rank with no samples waits, costs nothing
        ([], (), 0.0),
    ],
)
def test_predicted_step_s(models: list[Model], batches: tuple[int, ...], seconds: float) -> None:
    assert predicted_step_s(models, batches) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("models", "total", "lower", "upper", "message"),
    [
        ([HEALTHY], 10, [1, 1], [10, 10], "same ranks"),
        ([], 0, [], [], "same ranks"),
        ([Model(0.0, 0.0)], 10, [1], [10], "per_sample_s"),
        ([Model(-1.0, 0.001)], 10, [1], [10], "fixed_s"),
        ([Model(float("inf"), 0.001)], 10, [1], [10], "finite"),
        ([HEALTHY], 10, [5], [4], "empty"),
        ([HEALTHY, HEALTHY], 10, [6, 6], [10, 10], "no plan"),
        ([HEALTHY, HEALTHY], 30, [1, 1], [10, 10], "no plan"),
    ],
)
def test_refuses_what_cannot_be_planned(
    models: list[Model], total: int, lower: list[int], upper: list[int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        balanced_batches(models, total, lower, upper)


def _random_case(rng: random.Random, ranks: int) -> tuple[list[Model], int, list[int], list[int]]:
    """Few distinct models shared by many ranks (as the policies plan), ties included."""
    kinds = [
        Model(rng.choice([0.0, 0.002, rng.uniform(0, 0.05)]), rng.choice([0.001, 0.002, 0.003]))
        for _ in range(rng.randint(1, 4))
    ]
    models = [rng.choice(kinds) for _ in range(ranks)]
    lower = [rng.choice([0, 1, 1, 4]) for _ in range(ranks)]
    upper = [lo + rng.choice([0, 8, 64, 10_000]) for lo in lower]
    total = rng.randint(sum(lower), min(sum(upper), sum(lower) + 64 * ranks))
    return models, total, lower, upper


@pytest.mark.parametrize("seed", range(60))
def test_class_planning_gives_the_per_rank_plans(seed: int) -> None:
    """Same plans as the per-rank algorithm it replaced (tests.unit.planning_reference.py),
    with models shared by object and by value, ties and bounds pinning ranks."""
    from tests.unit.planning_reference import reference_balanced_batches

    rng = random.Random(seed)
    models, total, lower, upper = _random_case(rng, rng.choice([3, 17, 200]))
    copies = [Model(*m) for m in models]  # equal values, distinct objects
    expected = reference_balanced_batches(models, total, lower, upper)
    assert balanced_batches(models, total, lower, upper) == expected
    assert balanced_batches(copies, total, lower, upper) == expected


def test_a_bad_model_is_named_by_its_first_rank() -> None:
    with pytest.raises(ValueError, match="rank 2: per_sample_s"):
        balanced_batches([HEALTHY, HEALTHY, Model(0, 0), Model(0, 0)], 8, [1] * 4, [8] * 4)


@pytest.mark.parametrize("seed", range(20))
def test_the_common_model_is_found_wherever_its_ranks_are(seed: int) -> None:
    """A model object shared by at least half the ranks plans as one class whether or
    not the first, middle and last ranks have it, and equal copies (which `count`
    matches) are not taken for it: the same plans as the per-rank algorithm."""
    from tests.unit.planning_reference import reference_balanced_batches

    rng = random.Random(seed)
    ranks = rng.choice([5, 64, 301])
    common = Model(0.03, 0.001)
    models = [common] * ranks
    for rank in (0, ranks // 2, ranks - 1, *rng.sample(range(ranks), ranks // 4)):
        models[rank] = rng.choice([Model(0.03, 0.001), Model(0.04, 0.003), SLOW])
    lower, upper = [1] * ranks, [64] * ranks
    total = rng.randint(ranks, 64 * ranks)
    expected = reference_balanced_batches(models, total, lower, upper)
    assert balanced_batches(models, total, lower, upper) == expected


@pytest.mark.parametrize("seed", range(20))
def test_median_model_counts_a_common_model_as_its_copies(seed: int) -> None:
    """The median of each part, the same float as `statistics.median` over every rank,
    whether or not most ranks share one model object."""
    import statistics

    from antdt.services.controller.balance import median_model

    rng = random.Random(seed)
    ranks = rng.randint(1, 40)
    common = Model(rng.choice([0.0, 0.03]), rng.choice([0.001, 0.002]))
    share = rng.random()
    models = [
        common if rng.random() < share else Model(rng.choice([0.0, 0.03, 0.05]), rng.random())
        for _ in range(ranks)
    ]
    median = median_model(models)
    assert median.fixed_s == statistics.median(m.fixed_s for m in models)
    assert median.per_sample_s == statistics.median(m.per_sample_s for m in models)


@pytest.mark.parametrize("seed", range(40))
def test_many_classes_plan_as_the_per_rank_algorithm(seed: int) -> None:
    """More classes than a few (a crowd of ranks held slow, each with its own model):
    planned in arrays, the rounding units by the heap where a class takes two; equal
    models in distinct objects make ties between classes. The per-rank plans."""
    from tests.unit.planning_reference import reference_balanced_batches

    rng = random.Random(seed)
    ranks = rng.choice([20, 50, 120, 400])
    values = [
        Model(rng.choice([0.0, 0.01, 0.03]), rng.choice([0.001, 0.0015, 0.002, 0.003]))
        for _ in range(rng.choice([2, 5, 50]))
    ]
    common, share = Model(0.03, 0.001), rng.choice([0.0, 0.5, 0.9])
    models = [common if rng.random() < share else Model(*rng.choice(values)) for _ in range(ranks)]
    if rng.random() < 0.3:
        lower = [rng.randint(0, 4) for _ in range(ranks)]
        upper = [low + rng.randint(0, 80) for low in lower]
    else:
        lower, upper = [1] * ranks, [rng.choice([64, 200])] * ranks
    total = rng.randint(sum(lower), sum(upper))
    expected = reference_balanced_batches(models, total, lower, upper)
    assert balanced_batches(models, total, lower, upper) == expected


def test_many_classes_refuse_as_a_few_do() -> None:
    """The array path names the first rank at fault as the per-class loop does."""
    models = [Model(0.01 * i, 0.001) for i in range(40)]
    models[23] = Model(0.0, float("nan"))
    with pytest.raises(ValueError, match="rank 23: per_sample_s"):
        balanced_batches(models, 400, [1] * 40, [64] * 40)
    with pytest.raises(ValueError, match="no plan within the bounds"):
        balanced_batches(models[:23], 23 * 64 + 1, [1] * 23, [64] * 23)


@pytest.mark.parametrize("ranks", [1, 7, 300])
def test_equal_models_in_distinct_objects_plan_as_one_class(ranks: int) -> None:
    """Every rank's model equal (one object or copies): the per-rank plans, and the
    median model is that model."""
    from antdt.services.controller.balance import median_model
    from tests.unit.planning_reference import reference_balanced_batches

    for models in ([HEALTHY] * ranks, [Model(*HEALTHY) for _ in range(ranks)]):
        total = 37 * ranks + 5
        lower, upper = [1] * ranks, [64] * ranks
        expected = reference_balanced_batches(models, total, lower, upper)
        assert balanced_batches(models, total, lower, upper) == expected
        assert median_model(models) == HEALTHY


def test_models_made_at_c_speed_are_the_models_made_one_by_one() -> None:
    fixed, per_sample = [0.5, 0.0, 1e-3], [0.01, 2.0, 0.25]
    made = step_models(fixed, per_sample)
    one_by_one = [StepModel(f, p) for f, p in zip(fixed, per_sample, strict=True)]
    assert made == one_by_one
    assert all(type(m) is StepModel for m in made)
    assert [m.predict(8) for m in made] == [m.predict(8) for m in one_by_one]
    assert [m.per_sample_s for m in made] == per_sample
    with pytest.raises(ValueError):
        step_models(fixed, per_sample[:2])
