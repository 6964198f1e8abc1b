"""The batch plans the policies aim at, and how each predicts a plan's step time. Pure.

Both keep the global batch, the per-rank bounds and memory caps; a rank of unknown speed
keeps its batch. Under BSP a step lasts as long as its slowest rank."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import compress, repeat
from operator import attrgetter, is_not
from typing import cast

import numpy as np

from antdt.services.controller.balance import ClassTable, StepModel, classes_of, plan_classes
from antdt.services.controller.guardrails import batch_bounds
from antdt.services.controller.plans import predicted_step_time, proportional_shares
from antdt.services.controller.splits import Floats, ints, one_value
from antdt.services.controller.view import JobView

#: A balanced plan whose ranks but this many share one model predicts by class.
_RARE = 64


@dataclass(frozen=True)
class Target:
    """A plan for every rank, and the figures it was computed from for its known ranks."""

    plan: tuple[int, ...]
    known: Sequence[int]  # ranks the plan was computed for; the others kept their batch
    speeds: tuple[float, ...] | None  # per known rank, samples/s (proportional plans)
    models: tuple[StepModel, ...] | None  # per known rank (balanced plans)
    classes: ClassTable | None = None  # the known ranks by model, as the plan was made

    def step_s(self, plan: Sequence[int]) -> float:
        """The predicted step time of `plan` over the known ranks, as this target sees it."""
        batches = plan if len(plan) == len(self.known) else list(map(plan.__getitem__, self.known))
        if self.models is None:
            assert self.speeds is not None
            return predicted_step_time(batches, self.speeds)
        if self._rare is None:  # many ranks with a model of their own: in arrays
            fixed, per_sample = self.parts
            sizes = ints(batches)
            busy = sizes != 0
            times = fixed[busy] + per_sample[busy] * sizes[busy]
            return float(times.max()) if len(times) else 0.0
        # Ranks sharing the common model: its time at their largest batch (per_sample_s
        # > 0, as every balanced plan's model, so time grows with the batch).
        rare, common = self._rare, self._common
        times = [self.models[r].predict(batches[r]) for r in rare if batches[r]]
        top = _largest(batches)
        rare_at_top = sum(1 for r in rare if batches[r] == top)
        if rare_at_top and batches.count(top) == rare_at_top:  # only odd ranks reach it
            rest = set(range(len(batches))) - set(rare)
            top = max((batches[r] for r in rest), default=0)
        if top:
            times.append(common.predict(top))
        return max(times, default=0.0)

    @cached_property
    def planned_step_s(self) -> float:
        """`step_s` of the target's own plan (once: several estimates read it)."""
        return self.step_s(self.plan)

    @cached_property
    def parts(self) -> tuple[Floats, Floats]:
        """The models' fixed and per-sample parts, per known rank."""
        assert self.models is not None
        if self.classes is not None:
            return self.classes.parts()
        count = len(self.models)
        return (
            np.fromiter(map(attrgetter("fixed_s"), self.models), np.float64, count),
            np.fromiter(map(attrgetter("per_sample_s"), self.models), np.float64, count),
        )

    @cached_property
    def _rare(self) -> list[int] | None:
        """The known positions outside the common model's class (the planner's largest;
        without its table, those whose model object is not the first one's), when they
        are few (the usual plan: one model for the ranks not held deviating); else None."""
        assert self.models is not None
        models = self.models
        if not models:
            return None
        if self.classes is not None:
            return self.classes.odd_ranks(_RARE)
        rare = list(compress(range(len(models)), map(is_not, models, repeat(models[0]))))
        return rare if len(rare) <= _RARE else None

    @property
    def _common(self) -> StepModel:
        """The model of the ranks not in `_rare`."""
        assert self.models is not None
        if self.classes is None:
            return self.models[0]
        return cast(StepModel, self.classes.models[self.classes.largest])

    @property
    def how(self) -> str:
        if self.models is not None:
            return "batches balancing the ranks' step-time models"
        return "batches proportional to compute speed"


def _largest(batches: Sequence[int]) -> int:
    """The largest batch (0 when none), without comparing every pair when there is one."""
    if not batches:
        return 0
    return batches[0] if one_value(batches) else max(batches)


def proportional_target(view: JobView, speeds: Sequence[float | None]) -> Target | None:
    """Shares proportional to speed (samples/s); None when no plan fits the bounds."""
    current = view.plan.local_batch
    _, upper = batch_bounds(view)
    known = tuple(r for r, s in enumerate(speeds) if s is not None)
    rates = tuple(s for s in speeds if s is not None)
    try:
        shares = proportional_shares(
            view.spec.global_batch - _kept(current, known),
            rates,
            min_b=view.spec.min_local_batch,
            caps={i: upper[r] for i, r in enumerate(known)},
        )
    except ValueError:
        return None
    return Target(_fill(current, known, shares), known, rates, None)


def balanced_target(view: JobView, models: Sequence[StepModel | None]) -> Target | None:
    """The plan whose slowest predicted rank is fastest (`balanced_batches`); None when
    no plan fits the bounds."""
    key = list(models)
    return view.remembered("balanced_target", key, lambda: _balanced_target(view, key))


def healed_target(
    view: JobView, models: Sequence[StepModel | None], rank: int, model: StepModel
) -> Target | None:
    """`balanced_target` of `models` with `rank`'s model replaced by `model`; from the
    current target's classes when that changes one class only (`_own_class`): a crowd of
    held ranks is a class each, and grouping 10,000 ranks again for one changed model
    was a third of antdt-nd's restart estimate."""
    healed = list(models)
    healed[rank] = model
    return view.remembered(
        "balanced_target", healed, lambda: _healed_target(view, models, healed, rank)
    )


def _healed_target(
    view: JobView, models: Sequence[StepModel | None], healed: list[StepModel | None], rank: int
) -> Target | None:
    now = balanced_target(view, models)
    at = None if now is None else _own_class(now, rank, healed[rank])
    if at is None:
        return _balanced_target(view, healed)
    assert now is not None and now.classes is not None  # _own_class found a class
    classes = now.classes.with_model(at, cast(StepModel, healed[rank]))
    try:
        shares = plan_classes(classes, view.spec.global_batch)
    except ValueError:
        return None
    fitted = cast(tuple[StepModel, ...], tuple(healed))
    return Target(_fill(view.plan.local_batch, now.known, shares), now.known, None, fitted, classes)


def _own_class(now: Target, rank: int, model: StepModel | None) -> int | None:
    """The class of `now` that is `rank` alone, when a model of its own there (`model`,
    no class's) leaves every other class as `classes_of` would find it: every rank
    known, one bound for all, more than half the ranks one model object, and not every
    model then equal to that one (`classes_of` plans equal models as one class). Each
    of its ways groups the ranks by model object in order of their first rank, so one
    rank's new object changes its own class only. None otherwise."""
    table, n = now.classes, len(now.known)
    if table is None or model is None or not isinstance(now.known, range):
        return None
    if not (one_value(table.lo) and one_value(table.hi)):
        return None
    common = table.models[table.largest]
    if 2 * int(table.sizes[table.largest]) <= n:
        return None
    at = bisect.bisect_left([ranks[0] for ranks in table.ranks], rank)
    if at == len(table.ranks) or table.ranks[at] != [rank]:
        return None
    if any(m is model for m in table.models):
        return None
    others = (m for i, m in enumerate(table.models) if i != at)
    if model == common and all(m == common for m in others):
        return None
    return at


def _balanced_target(view: JobView, models: Sequence[StepModel | None]) -> Target | None:
    current = view.plan.local_batch
    lower, upper = batch_bounds(view)
    known: Sequence[int]
    if not all(models):  # a model is a pair, always true: only None is false (C speed)
        present = [m is not None for m in models]
        known = tuple(compress(range(len(models)), present))
        fitted = cast(tuple[StepModel, ...], tuple(compress(models, present)))
        low, high = list(compress(lower, present)), list(compress(upper, present))
    else:  # every rank known
        known, fitted = range(len(models)), cast(tuple[StepModel, ...], tuple(models))
        low, high = list(lower), list(upper)
    try:
        classes = classes_of(fitted, low, high)
        shares = plan_classes(classes, view.spec.global_batch - _kept(current, known))
    except ValueError:
        return None
    return Target(_fill(current, known, shares), known, None, fitted, classes)


def _kept(current: Sequence[int], known: Sequence[int]) -> int:
    """Samples that ranks outside `known` keep."""
    if len(known) == len(current):
        return 0
    inside = set(known)
    return sum(b for r, b in enumerate(current) if r not in inside)


def _fill(current: Sequence[int], ranks: Sequence[int], shares: Sequence[int]) -> tuple[int, ...]:
    """`current` with `ranks` given `shares`, in order."""
    if len(ranks) == len(current):
        return tuple(shares)  # `ranks` (increasing, as the targets list them) are all
    plan = list(current)
    for rank, share in zip(ranks, shares, strict=True):
        plan[rank] = share
    return tuple(plan)


__all__ = ["Target", "balanced_target", "healed_target", "proportional_target"]
