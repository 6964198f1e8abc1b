"""The planners as they were before they were made to scale (balanced_batches per rank,
bounded_change in Fractions, proportional_shares rank by rank): the references tests
hold the faster ones to."""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
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


def reference_upper_bounds(
    n: int, global_batch: int, max_b: int | None, caps: Mapping[int, int] | None
) -> tuple[int, ...]:
    """Per-rank largest batch: min(max_b, memory cap), never above the global batch."""
    top = global_batch if max_b is None else min(max_b, global_batch)
    caps = caps or {}
    return tuple(min(top, caps.get(rank, top)) for rank in range(n))


def reference_check_feasible(global_batch: int, lower: Sequence[int], upper: Sequence[int]) -> None:
    """Raise ValueError, saying why, when no plan within the bounds sums to global_batch."""
    if not lower:
        raise ValueError("a plan needs at least one rank")
    for rank, (lo, hi) in enumerate(zip(lower, upper, strict=True)):
        if hi < lo:
            raise ValueError(f"rank {rank}: largest batch {hi} is below the smallest {lo}")
    if sum(lower) > global_batch:
        raise ValueError(f"minimum batches sum to {sum(lower)} > global batch {global_batch}")
    if sum(upper) < global_batch:
        raise ValueError(
            f"ranks hold at most {sum(upper)} samples (max batch, memory caps) "
            f"< global batch {global_batch}"
        )


def reference_proportional_shares(
    global_batch: int,
    speeds: Sequence[float],
    min_b: int = 0,
    max_b: int | None = None,
    caps: Mapping[int, int] | None = None,
) -> tuple[int, ...]:
    """Split `global_batch` in proportion to `speeds` (samples/s) within the per-rank
    bounds [min_b, min(max_b, caps[rank])]: shares outside are pinned to the bound and the
    rest re-split (water-filling), then rounded by largest remainder so that the sum is
    exact. Ties go to the lower rank: the result is deterministic."""
    if any(not math.isfinite(s) or s <= 0 for s in speeds):
        raise ValueError(f"speeds must be positive and finite, got {list(speeds)}")
    lower = (min_b,) * len(speeds)
    upper = reference_upper_bounds(len(speeds), global_batch, max_b, caps)
    reference_check_feasible(global_batch, lower, upper)
    real = reference_water_fill(global_batch, speeds, lower, upper)
    return reference_round_keeping_sum(real, global_batch, lower, upper)


def reference_water_fill(
    total: int, speeds: Sequence[float], lower: Sequence[int], upper: Sequence[int]
) -> list[float]:
    """Real-valued proportional shares with ranks pinned at their bounds where needed."""
    pinned: dict[int, float] = {}
    while True:
        free = [r for r in range(len(speeds)) if r not in pinned]
        if not free:
            return [pinned[r] for r in range(len(speeds))]
        remaining = total - sum(pinned.values())
        weight = sum(speeds[r] for r in free)
        share = {r: remaining * speeds[r] / weight for r in free}
        over = [r for r in free if share[r] > upper[r]]
        under = [r for r in free if share[r] < lower[r]]
        if not over and not under:
            return [pinned[r] if r in pinned else share[r] for r in range(len(speeds))]
        # Pin the side that is further out: pinning it can only push the others back
        # towards their bounds, so the loop ends within len(speeds) rounds.
        excess = sum(share[r] - upper[r] for r in over)
        deficit = sum(lower[r] - share[r] for r in under)
        if excess >= deficit:
            pinned.update((r, float(upper[r])) for r in over)
        else:
            pinned.update((r, float(lower[r])) for r in under)


def reference_round_keeping_sum(
    real: Sequence[float], total: int, lower: Sequence[int], upper: Sequence[int]
) -> tuple[int, ...]:
    """Largest-remainder rounding within bounds; the sum comes out exactly `total`."""
    shares = [min(max(math.floor(x), lo), hi) for x, lo, hi in zip(real, lower, upper, strict=True)]
    by_remainder = sorted(range(len(real)), key=lambda r: (shares[r] - real[r], r))
    missing = total - sum(shares)
    while missing:
        # One unit per rank per pass, largest remainder first (smallest when taking).
        order = by_remainder if missing > 0 else by_remainder[::-1]
        step = 1 if missing > 0 else -1
        movable = [r for r in order if lower[r] <= shares[r] + step <= upper[r]]
        if not movable:
            raise ValueError("no plan within the bounds sums to the global batch")
        for r in movable[: abs(missing)]:
            shares[r] += step
            missing -= step
    return tuple(shares)
