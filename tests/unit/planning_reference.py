"""The planners as they were before they were made to scale (balanced_batches per rank,
bounded_change in Fractions): the references tests hold the faster ones to."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from fractions import Fraction

from antdt.services.controller.balance import StepTimeModel


def reference_balanced_batches(
    models: Sequence[StepTimeModel],
    global_batch: int,
    lower: Sequence[int],
    upper: Sequence[int],
) -> tuple[int, ...]:
    """The per-rank batches, summing to `global_batch` with lower[r] <= b_r <= upper[r],
    that minimise the largest predicted step time; ties go to the lower rank.

    ValueError when a model is not positive and finite or no plan fits the bounds."""
    _check(models, global_batch, lower, upper)
    level = _water_level(models, global_batch, lower, upper)
    batches = [
        min(hi, max(lo, math.floor((level - m.fixed_s) / m.per_sample_s)))
        for m, lo, hi in zip(models, lower, upper, strict=True)
    ]
    return _settle(models, batches, global_batch, lower, upper)


def _check(
    models: Sequence[StepTimeModel], total: int, lower: Sequence[int], upper: Sequence[int]
) -> None:
    if not len(models) == len(lower) == len(upper) or not models:
        raise ValueError("models, lower and upper must name the same ranks, at least one")
    for rank, m in enumerate(models):
        if not (m.per_sample_s > 0 and m.fixed_s >= 0):
            raise ValueError(f"rank {rank}: per_sample_s must be > 0 and fixed_s >= 0")
        if not (math.isfinite(m.per_sample_s) and math.isfinite(m.fixed_s)):
            raise ValueError(f"rank {rank}: the model must be finite")
        if not 0 <= lower[rank] <= upper[rank]:
            raise ValueError(f"rank {rank}: bounds [{lower[rank]}, {upper[rank]}] are empty")
    if not sum(lower) <= total <= sum(upper):
        raise ValueError(f"no plan within the bounds sums to the global batch {total}")


def _water_level(
    models: Sequence[StepTimeModel], total: int, lower: Sequence[int], upper: Sequence[int]
) -> float:
    """The step time T at which the real-valued clamped shares (T - a) / b sum to `total`."""

    def samples_at(level: float) -> float:
        return sum(
            min(hi, max(lo, (level - m.fixed_s) / m.per_sample_s))
            for m, lo, hi in zip(models, lower, upper, strict=True)
        )

    low = min(m.fixed_s + m.per_sample_s * lo for m, lo in zip(models, lower, strict=True))
    high = max(m.fixed_s + m.per_sample_s * hi for m, hi in zip(models, upper, strict=True))
    for _ in range(200):  # bisection: far below one sample's time at any scale
        middle = (low + high) / 2.0
        if samples_at(middle) < total:
            low = middle
        else:
            high = middle
    return low


def _settle(
    models: Sequence[StepTimeModel],
    batches: list[int],
    total: int,
    lower: Sequence[int],
    upper: Sequence[int],
) -> tuple[int, ...]:
    """Hand out the samples rounding left (or take back any extra), one at a time, each to
    the rank whose predicted time after it is smallest (from the slowest when taking)."""
    missing = total - sum(batches)
    sign = 1 if missing > 0 else -1
    heap = [
        (sign * (m.fixed_s + m.per_sample_s * (b + max(sign, 0))), rank)
        for rank, (m, b) in enumerate(zip(models, batches, strict=True))
        if lower[rank] <= b + sign <= upper[rank]
    ]
    heapq.heapify(heap)
    while missing:
        _, rank = heapq.heappop(heap)
        batches[rank] += sign
        missing -= sign
        m, b = models[rank], batches[rank]
        if lower[rank] <= b + sign <= upper[rank]:
            after = m.fixed_s + m.per_sample_s * (b + max(sign, 0))
            heapq.heappush(heap, (sign * after, rank))
    return tuple(batches)


def reference_bounded_change(
    old: Sequence[int], new: Sequence[int], max_fraction: float
) -> tuple[int, ...]:
    """Move from `old` towards `new`, every rank by the same fraction of its way, so that
    none moves more than max(1, floor(max_fraction x max(old_i, mean batch))). The sum
    stays, and each value lies between old_i and new_i (within any bounds both respect);
    the mean term lets a rank starved to a tiny batch grow back in a few moves."""
    if len(old) != len(new) or sum(old) != sum(new):
        raise ValueError("old and new plans must have the same ranks and the same sum")
    if not max_fraction > 0:
        raise ValueError("max_fraction must be > 0")
    if math.isinf(max_fraction):
        return tuple(new)
    mean = sum(old) / len(old)
    limits = [max(1, math.floor(max_fraction * max(b, mean))) for b in old]
    deltas = [b - a for a, b in zip(old, new, strict=True)]
    scale = min(
        [Fraction(1)] + [Fraction(lim, abs(d)) for d, lim in zip(deltas, limits, strict=True) if d]
    )
    if scale == 1:
        return tuple(new)
    moved = [d * scale for d in deltas]  # exact: sums to zero
    steps = [int(m) for m in moved]  # truncated towards old
    leftover = [m - s for m, s in zip(moved, steps, strict=True)]
    missing = -sum(steps)
    # Hand the rounding units to the ranks that were cut the most, in their direction.
    if missing > 0:
        order = sorted(range(len(old)), key=lambda r: (-leftover[r], r))[:missing]
    else:
        order = sorted(range(len(old)), key=lambda r: (leftover[r], r))[:-missing]
    for r in order:
        steps[r] += 1 if missing > 0 else -1
    return tuple(a + s for a, s in zip(old, steps, strict=True))
