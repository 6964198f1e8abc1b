"""The arithmetic of `plans` over every rank at once, in numpy arrays. Pure.

At 10,000 ranks a pass of Python arithmetic over the ranks costs about a millisecond and
a plan takes a dozen; one numpy pass costs microseconds, the conversion in and out a
fifth of a millisecond each. The floats are those of the rank-by-rank code the tests
hold these to (tests/unit/planning_reference.py): elementwise IEEE operations are the
same in numpy, and every sum of floats is Python's, left to right (numpy sums pairwise).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

#: The controller's array types (the planners, the health's sorted columns).
Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


def water_fill(total: int, speeds: Sequence[float], lower: Ints, upper: Ints) -> Floats:
    """Real-valued proportional shares with ranks pinned at their bounds where needed:
    the free ranks share what the pinned ones leave, in proportion to their speeds."""
    rates = np.asarray(speeds, dtype=np.float64)
    pinned = np.zeros(len(rates), dtype=bool)
    at = np.zeros(len(rates), dtype=np.float64)  # the pinned ranks' shares
    free = np.arange(len(rates))
    weight = sum(speeds)  # Python's sum, in rank order, as below
    remaining: float = total
    while True:
        shares = remaining * rates[free] / weight
        over = shares > upper[free]
        under = shares < lower[free]
        if not over.any() and not under.any():
            at[free] = shares
            return at
        # Pin the side that is further out: pinning it can only push the others back
        # towards their bounds, so the loop ends within len(speeds) rounds.
        excess = sum((shares[over] - upper[free][over]).tolist())
        deficit = sum((lower[free][under] - shares[under]).tolist())
        newly = free[over] if excess >= deficit else free[under]
        at[newly] = (upper if excess >= deficit else lower)[newly]
        pinned[newly] = True
        free = np.flatnonzero(~pinned)
        if not len(free):
            return at
        remaining = total - sum(at[pinned].tolist())
        weight = sum(rates[free].tolist())


def round_keeping_sum(real: Floats, total: int, lower: Ints, upper: Ints) -> Ints:
    """Largest-remainder rounding of `real` within bounds; the sum comes out exactly
    `total`, ties to the lower rank (ValueError when no plan within the bounds does)."""
    shares = np.floor(real).astype(np.int64)
    if not (lower.max() <= shares.min() and shares.max() <= upper.min()):
        shares = np.minimum(np.maximum(shares, lower), upper)
    remainders = shares - real  # the rank with the largest fraction first
    missing = total - int(shares.sum())
    if not missing:
        return shares
    by_remainder = np.argsort(remainders, kind="stable")  # ties by rank
    while missing:
        # One unit per rank per pass, largest remainder first (smallest when taking).
        order = by_remainder if missing > 0 else by_remainder[::-1]
        step = 1 if missing > 0 else -1
        moved = shares[order] + step
        movable = order[(lower[order] <= moved) & (moved <= upper[order])][: abs(missing)]
        if not len(movable):
            raise ValueError("no plan within the bounds sums to the global batch")
        shares[movable] += step
        missing -= step * len(movable)
    return shares


def bounded_moves(old: Ints, new: Ints, max_fraction: float, total: int) -> Ints | None:
    """`plans.bounded_change`'s plan of two valid plans (same ranks and sum `total`, a
    finite fraction > 0), or None when `new` is within reach. Every rank moves the same
    exact fraction num / den of its way, truncated towards `old`; the rounding units go
    to the ranks cut the most, in their direction (ties by rank)."""
    mean = total / len(old)
    limits = np.maximum(1, np.floor(max_fraction * np.maximum(old, mean))).astype(np.int64)
    deltas = new - old
    num, den = _scale(deltas, limits)
    if num >= den:
        return None
    magnitude = np.abs(deltas) * num // den  # truncated towards 0, as the exact fraction
    steps = np.where(deltas >= 0, magnitude, -magnitude)
    leftover = deltas * num - steps * den  # x den: integers order them as the fractions
    missing = -int(steps.sum())
    if missing > 0:
        order = np.argsort(-leftover, kind="stable")[:missing]
    else:
        order = np.argsort(leftover, kind="stable")[:-missing]
    steps[order] += 1 if missing > 0 else -1
    return old + steps


def _scale(deltas: Ints, limits: Ints) -> tuple[int, int]:
    """The smallest limit / |delta| over the ranks that move, as num / den (1 / 1 when it
    is larger), exactly: the float ratios pick the few candidates, integers decide."""
    moving = deltas != 0
    if not moving.any():
        return 1, 1
    sizes, caps = np.abs(deltas[moving]), limits[moving]
    ratios = caps / sizes
    near = ratios <= ratios.min() * (1.0 + 1e-9)
    num, den = 1, 1
    for lim, d in zip(caps[near].tolist(), sizes[near].tolist(), strict=True):
        if lim * den < num * d:
            num, den = lim, d
    return num, den


def one_value(values: Sequence[object]) -> bool:
    """Whether `values` (a list or tuple, not empty) all equal the first: read by `count`
    at C speed, which matches an identical object without a comparison (equal shares,
    uniform bounds and the common model are one object throughout)."""
    return values.count(values[0]) == len(values)


def ints(values: Sequence[int]) -> Ints:
    """`values` as an array; one value throughout is filled without reading each."""
    if isinstance(values, list | tuple) and values and one_value(values):
        return np.full(len(values), values[0], dtype=np.int64)
    return np.fromiter(values, dtype=np.int64, count=len(values))


__all__ = [
    "Floats",
    "Ints",
    "bounded_moves",
    "ints",
    "one_value",
    "round_keeping_sum",
    "water_fill",
]
