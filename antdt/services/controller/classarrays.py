"""`balance`'s arithmetic over many classes of ranks at once, in numpy arrays. Pure.

A job with a crowd of stragglers plans hundreds to thousands of classes (each held rank
has a model of its own); a Python loop over them costs microseconds per class and
operation. Here the same floats come from whole-array operations: elementwise IEEE
arithmetic is numpy's as Python's, and the sweep's running sums are `cumsum`, which adds
left to right as the loop did. Where an exact answer needs the loop (the rounding units
moving a class twice), `first_round` says so and the caller runs it."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from antdt.services.controller.splits import Floats, Ints


class ClassArrays(NamedTuple):
    """Per class, in class order: its number of ranks, model and bounds."""

    size: Ints
    fixed_s: Floats
    per_sample_s: Floats
    lo: Ints
    hi: Ints

    def time_at(self, batch: Ints) -> Floats:
        return self.fixed_s + self.per_sample_s * batch

    def valid(self) -> bool:
        """Every model positive and finite, every bound pair ordered."""
        fixed, per_sample = self.fixed_s, self.per_sample_s
        models = (per_sample > 0) & (fixed >= 0) & np.isfinite(per_sample) & np.isfinite(fixed)
        return bool(models.all() and ((self.lo >= 0) & (self.lo <= self.hi)).all())


def swept_level(c: ClassArrays, total: int, hair: float) -> float:
    """The water level: the step time T at which the classes' real shares, (T - fixed) /
    per_sample clamped to their bounds, sum to `total`. Their sum is linear between the
    times a class leaves its lower bound or reaches its upper one (its bend points): one
    sweep over them in time order, `hair` below the level found."""
    slope = c.size / c.per_sample_s
    offset = c.size * c.fixed_s / c.per_sample_s
    # Bends in the loop's order: each class's lower then upper one, sorted stably by time.
    times = np.column_stack((c.time_at(c.lo), c.time_at(c.hi))).ravel()
    samples = np.column_stack((-c.size * c.lo, c.size * c.hi)).ravel()
    slopes = np.column_stack((slope, -slope)).ravel()
    offsets = np.column_stack((offset, -offset)).ravel()
    order = np.argsort(times, kind="stable")
    times, samples, slopes, offsets = times[order], samples[order], slopes[order], offsets[order]
    # Before bend i the sum is fixed_i + slope_i x T - offset_i: the running sums of the
    # bends before it (the first bend sees none).
    at_low = float(int((c.size * c.lo).sum()))
    fixed = np.concatenate(([at_low], at_low + np.cumsum(samples[:-1]).astype(np.float64)))
    slope_before = np.concatenate(([0.0], np.cumsum(slopes[:-1])))
    offset_before = np.concatenate(([0.0], np.cumsum(offsets[:-1])))
    reached = fixed + slope_before * times - offset_before >= total
    if not reached.any():
        return float(times[-1])
    i = int(reached.argmax())
    time, slope_i = float(times[i]), float(slope_before[i])
    level = (total - float(fixed[i]) + float(offset_before[i])) / slope_i if slope_i > 0 else time
    return min(level, time) * (1.0 - hair)


def floors(c: ClassArrays, level: float) -> Ints:
    """Each class's batch at `level`: its real share floored, within its bounds."""
    share = np.floor((level - c.fixed_s) / c.per_sample_s)
    return np.minimum(c.hi, np.maximum(c.lo, share)).astype(np.int64)


class FirstRound(NamedTuple):
    """The rounding units handed out in one pass over the classes by key: `moved`
    classes move one unit (sign), then `cut` (a class index list, tied) shares `left`
    units among its lowest ranks (none when `left` is 0)."""

    moved: Ints
    cut: list[int]
    left: int


def first_round(c: ClassArrays, batch: Ints, missing: int) -> FirstRound | None:
    """`balance._settle`'s heap, when no class moves twice: the classes that can move
    (a unit towards `missing`) by key (their time after the unit, ties together), and
    where the units run out. None when the loop must decide: the units outlast one pass,
    or a class moved would come back into the heap before the last tie is taken."""
    sign = 1 if missing > 0 else -1
    movable = np.flatnonzero((c.lo <= batch + sign) & (batch + sign <= c.hi))
    keys = _keys(c, movable, batch[movable], sign)
    order = np.lexsort((movable, keys))  # by key, ties by class, as the heap pops them
    movable, keys = movable[order], keys[order]
    sizes = np.cumsum(c.size[movable])
    need = abs(missing)
    if not len(movable) or sizes[-1] < need:
        return None
    final_key = keys[int(np.searchsorted(sizes, need))]  # the tie the units run out in
    tied = keys == final_key
    first = int(tied.argmax())
    taken = int(sizes[first - 1]) if first else 0
    before = movable[:first]
    # A class moved comes back with its next unit's key: at or under the final tie's, the
    # heap would take it again, or into the tie.
    again = batch[before] + sign
    still = (c.lo[before] <= again + sign) & (again + sign <= c.hi[before])
    if (_keys(c, before[still], again[still], sign) <= final_key).any():
        return None
    group = movable[tied]
    left = need - taken
    if int(c.size[group].sum()) == left:  # the tie moves whole: nothing is cut
        return FirstRound(movable[: first + len(group)], [], 0)
    return FirstRound(before, group.tolist(), left)


def _keys(c: ClassArrays, classes: Ints, batch: Ints, sign: int) -> Floats:
    """The heap's key of `classes` at `batch`: sign x their time after one more unit."""
    return sign * (c.fixed_s[classes] + c.per_sample_s[classes] * (batch + max(sign, 0)))


__all__ = ["ClassArrays", "FirstRound", "first_round", "floors", "swept_level"]
