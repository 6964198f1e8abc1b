"""Local batches that equalise predicted step times under step-time models. Pure.

A rank's step takes fixed_s + per_sample_s x batch (the monitor fits both per rank), so
shares proportional to samples/s overshoot when the fixed part is large: a rank cut to
half its batch keeps its fixed part. Here the plan is the integer split of the global
batch, within per-rank bounds, whose slowest predicted rank is as fast as possible.
"""

from __future__ import annotations

import bisect
import heapq
import math
import statistics
from collections.abc import Iterable, Sequence
from itertools import chain, compress, repeat
from operator import add, attrgetter, is_not, mul, sub, truediv
from typing import NamedTuple, cast

import numpy as np

from antdt.services.controller.classarrays import (
    ClassArrays,
    FirstRound,
    first_round,
    floors,
    swept_level,
)
from antdt.services.controller.rankclasses import (
    FEW,
    ClassTable,
    RankClass,
    StepTimeModel,
    common_model,
    group_by_model,
)


class StepModel(NamedTuple):
    """The controller's copy of a rank's model, as health reports it (or a stand-in)."""

    fixed_s: float
    per_sample_s: float

    def predict(self, batch: int) -> float:
        """Predicted compute seconds of one step at `batch` samples."""
        return self.fixed_s + self.per_sample_s * batch


def step_models(fixed: Iterable[float], per_sample: Iterable[float]) -> list[StepModel]:
    """`StepModel(f, p)` of each pair, made at C speed: `tuple.__new__`, as StepModel's
    own constructor does (a crowd's thousand held ranks each have a model)."""
    pairs = zip(fixed, per_sample, strict=True)
    return cast(list[StepModel], list(map(tuple.__new__, repeat(StepModel), pairs)))


def median_model(models: Sequence[StepTimeModel]) -> StepModel:
    """The typical rank of `models` (non-empty): the median of each part. A model object
    most ranks share is counted, not sorted with every copy."""
    common = common_model(models)
    if common is not None and models.count(common) == len(models):  # all equal to it
        return StepModel(common.fixed_s, common.per_sample_s)
    if common is None:
        return StepModel(
            statistics.median(map(attrgetter("fixed_s"), models)),
            statistics.median(map(attrgetter("per_sample_s"), models)),
        )
    rare = list(compress(models, map(is_not, models, repeat(common))))
    copies = len(models) - len(rare)
    return StepModel(
        _median_among(common.fixed_s, copies, sorted(map(attrgetter("fixed_s"), rare))),
        _median_among(common.per_sample_s, copies, sorted(map(attrgetter("per_sample_s"), rare))),
    )


def _median_among(value: float, copies: int, others: list[float]) -> float:
    """`statistics.median` of `others` (ascending) with `copies` of `value` among them."""
    at = bisect.bisect_left(others, value)

    def nth(i: int) -> float:
        return others[i] if i < at else value if i < at + copies else others[i - copies]

    n = len(others) + copies
    if n % 2:
        return nth(n // 2)
    return (nth(n // 2 - 1) + nth(n // 2)) / 2


def predicted_step_s(models: Sequence[StepTimeModel], batches: Sequence[int]) -> float:
    """Under BSP a step lasts as long as its slowest rank; ranks given 0 samples wait.
    The definition, one pass at C speed; targets predict their plans by class or from
    their class table's arrays (`Target.step_s`), which the tests hold to it."""
    if len(models) != len(batches):
        raise ValueError("models and batches must name the same ranks")
    fixed, per_sample = map(attrgetter("fixed_s"), models), map(attrgetter("per_sample_s"), models)
    times = map(add, fixed, map(mul, per_sample, batches))
    return max(compress(times, batches), default=0.0)


def balanced_batches(
    models: Sequence[StepTimeModel],
    global_batch: int,
    lower: Sequence[int],
    upper: Sequence[int],
) -> tuple[int, ...]:
    """The per-rank batches, summing to `global_batch` with lower[r] <= b_r <= upper[r],
    that minimise the largest predicted step time; ties go to the lower rank.

    ValueError when a model is not positive and finite or no plan fits the bounds.
    Ranks sharing a model object and bounds are planned as one class: the work grows with
    the classes, not the ranks (policies give every rank not held deviating one model)."""
    return plan_classes(classes_of(models, lower, upper), global_batch)


def classes_of(
    models: Sequence[StepTimeModel], lower: Sequence[int], upper: Sequence[int]
) -> ClassTable:
    """The ranks by class (one model object and the same bounds), in order of their first
    rank: what `plan_classes` plans, and what a caller may keep to read the plan by."""
    if not len(models) == len(lower) == len(upper) or not models:
        raise ValueError("models, lower and upper must name the same ranks, at least one")
    return group_by_model(models, lower, upper)


def plan_classes(table: ClassTable, global_batch: int) -> tuple[int, ...]:
    """`balanced_batches` of the ranks of `table` (every rank of the job in one class)."""
    ranks = sum(map(len, table.ranks))
    if len(table.models) > FEW:
        return _planned_in_arrays(table, global_batch, ranks)
    classes = table.classes()
    _check(classes, global_batch)
    level = _bisected_level(classes, global_batch)
    for c in classes:
        c.batch = min(c.hi, max(c.lo, math.floor((level - c.fixed_s) / c.per_sample_s)))
    return _settle(classes, global_batch, ranks)


def _planned_in_arrays(table: ClassTable, total: int, ranks: int) -> tuple[int, ...]:
    """`balanced_batches` of many classes: the same plan, its arithmetic over the classes
    in arrays (classarrays.py), the rounding units by the heap only when a class would
    take two."""
    count = len(table.models)
    arrays = ClassArrays(
        size=table.sizes,
        fixed_s=np.fromiter(map(attrgetter("fixed_s"), table.models), np.float64, count),
        per_sample_s=np.fromiter(map(attrgetter("per_sample_s"), table.models), np.float64, count),
        lo=np.array(table.lo, dtype=np.int64),
        hi=np.array(table.hi, dtype=np.int64),
    )
    low_sum, high_sum = int(arrays.size @ arrays.lo), int(arrays.size @ arrays.hi)
    if not arrays.valid() or not low_sum <= total <= high_sum:
        _check(table.classes(), total)  # raises, naming the first rank at fault
    batch = floors(arrays, swept_level(arrays, total, _HAIR))
    missing = total - int(arrays.size @ batch)
    moves = first_round(arrays, batch, missing) if missing else FirstRound(batch[:0], [], 0)
    if moves is None:
        classes = table.classes()
        for c, b in zip(classes, batch.tolist(), strict=True):
            c.batch = b
        return _settle(classes, total, ranks)
    sign = 1 if missing > 0 else -1
    batch[moves.moved] += sign
    plan = np.full(ranks, batch[table.largest], dtype=np.int64)
    others = table.others
    plan[table.others_ranks] = np.repeat(batch[others], arrays.size[others])
    if moves.left:
        cut = chain.from_iterable(map(table.ranks.__getitem__, moves.cut))
        plan[sorted(cut)[: moves.left]] += sign
    return tuple(plan.tolist())


def _check(classes: Sequence[RankClass], total: int) -> None:
    """The first failing rank's reason (ValueError), in rank order."""
    failures: list[tuple[int, str]] = []
    for c in classes:
        rank = c.ranks[0]
        if not (c.per_sample_s > 0 and c.fixed_s >= 0):
            failures.append((rank, f"rank {rank}: per_sample_s must be > 0 and fixed_s >= 0"))
        elif not (math.isfinite(c.per_sample_s) and math.isfinite(c.fixed_s)):
            failures.append((rank, f"rank {rank}: the model must be finite"))
        elif not 0 <= c.lo <= c.hi:
            failures.append((rank, f"rank {rank}: bounds [{c.lo}, {c.hi}] are empty"))
    if failures:
        raise ValueError(min(failures)[1])
    low_sum = sum(c.lo * len(c.ranks) for c in classes)
    high_sum = sum(c.hi * len(c.ranks) for c in classes)
    if not low_sum <= total <= high_sum:
        raise ValueError(f"no plan within the bounds sums to the global batch {total}")


#: The water level of many classes (swept over their bend points, classarrays.py) is
#: taken this far below the exact one, relative, as the bisection ends below it: far
#: above its rounding error, far below one sample's time. The floors then never start a
#: rank at a time a tie could give to a lower rank; the rounding hands out the rest.
_HAIR = 1e-12


def _bisected_level(classes: Sequence[RankClass], total: int) -> float:
    """The step time T at which the real-valued clamped shares (T - a) / b of a few
    classes sum to `total`, by bisection, each step one pass over the classes."""
    sizes = [len(c.ranks) for c in classes]
    lows, highs = [c.lo for c in classes], [c.hi for c in classes]
    fixed, per_sample = [c.fixed_s for c in classes], [c.per_sample_s for c in classes]

    def samples_at(level: float) -> float:
        """Sum of size x min(hi, max(lo, (level - fixed) / per_sample)), class by class
        in order (the same floats as a loop would add), at C speed."""
        shares = map(truediv, map(sub, repeat(level), fixed), per_sample)
        return sum(map(mul, sizes, map(min, highs, map(max, lows, shares))))

    low = min(c.time_at(c.lo) for c in classes)
    high = max(c.time_at(c.hi) for c in classes)
    for _ in range(200):  # bisection, until the interval is one float wide
        middle = (low + high) / 2.0
        below = samples_at(middle) < total
        if middle in (low, high):
            return middle if below else low  # no later halving moves `low` again
        if below:
            low = middle
        else:
            high = middle
    return low


def _settle(classes: list[RankClass], total: int, ranks: int) -> tuple[int, ...]:
    """Hand out the samples rounding left (or take back any extra), one at a time, each to
    the rank whose predicted time after it is smallest (from the slowest when taking),
    ties to the lower rank: a class's ranks tie, so they move a round at a time."""
    missing = total - sum(c.batch * len(c.ranks) for c in classes)
    sign = 1 if missing > 0 else -1
    heap = [(_key(c, sign), i) for i, c in enumerate(classes) if _movable(c, sign)]
    heapq.heapify(heap)
    extra: list[int] = []  # ranks of a round cut short, one more unit each
    while missing:
        key, i = heapq.heappop(heap)
        tied = [i]
        while heap and heap[0][0] == key:
            tied.append(heapq.heappop(heap)[1])
        size = sum(len(classes[t].ranks) for t in tied)
        if size > abs(missing):
            members = chain.from_iterable(classes[t].ranks for t in tied)
            extra = sorted(members)[: abs(missing)] if len(tied) > 1 else classes[i].ranks
            extra = extra[: abs(missing)]
            break
        missing -= sign * size
        for t in tied:
            classes[t].batch += sign
            if _movable(classes[t], sign):
                heapq.heappush(heap, (_key(classes[t], sign), t))
    largest = max(classes, key=lambda c: len(c.ranks))
    batches = [largest.batch] * ranks
    for c in classes:
        if c is not largest:
            for rank in c.ranks:
                batches[rank] = c.batch
    for rank in extra:
        batches[rank] += sign
    return tuple(batches)


def _key(c: RankClass, sign: int) -> float:
    return sign * c.time_at(c.batch + max(sign, 0))


def _movable(c: RankClass, sign: int) -> bool:
    return c.lo <= c.batch + sign <= c.hi


__all__ = [
    "ClassTable",
    "StepModel",
    "StepTimeModel",
    "balanced_batches",
    "classes_of",
    "median_model",
    "plan_classes",
    "predicted_step_s",
    "step_models",
]
