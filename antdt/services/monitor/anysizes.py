"""Many histories of any number of batch sizes fitted at once: `fit_speed`'s general
path (`speed.batch_levels`, then `speed.model_of_levels`), the same floats, over arrays.
Pure, no I/O. A balancer that moves each rank's batch every few windows leaves most
histories holding three sizes or more: at 10,000 ranks a health after a round of
windows fitted thousands of them one by one, each copied out of its block."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from antdt.services.monitor.history import Floats, Ints
from antdt.services.monitor.speed import SpeedConfig, SpeedModel

Bools = npt.NDArray[np.bool_]


def fit_any_sizes(
    samples: Ints, times: Floats, unused: Bools, fixed: float, config: SpeedConfig
) -> list[SpeedModel | None]:
    """`fit_speed` of each row's steps (those not `unused`), by `batch_levels`: a step
    counts when its samples are > 0 and its time in (0, inf), the others are dropped.
    `fixed`: the job's fixed part, >= 0. The caller leaves out any row holding a time
    past `ONE_BATCH_LIMIT` (its sums could overflow where the general path's do not)."""
    if not len(samples):
        return []
    rows, batch, level, count = _levels(samples, times, unused, config)
    sizes, seconds, steps = _by_row(len(samples), rows, batch, level, count)
    return _models(sizes, seconds, steps, fixed, config)


def _levels(
    samples: Ints, times: Floats, unused: Bools, config: SpeedConfig
) -> tuple[Ints, Ints, Floats, Ints]:
    """Each row's levels (`speed.batch_levels`), row after row, each row's by batch size
    ascending: their row, batch size, level and step count. Each row sorted by size then
    time, so that a size's times lie in order side by side; the dropped steps first."""
    valid = ~unused & (samples > 0) & (times > 0.0) & (times < np.inf)
    keys = np.where(valid, samples, 0)  # a size counted is > 0
    order = np.lexsort((np.where(valid, times, 0.0), keys), axis=-1)
    keys = np.take_along_axis(keys, order, axis=1).ravel()
    ordered = np.take_along_axis(times, order, axis=1).ravel()
    width = samples.shape[1]
    new = np.ones(len(keys), dtype=np.bool_)
    new[1:] = keys[1:] != keys[:-1]
    new[::width] = True  # each row starts a run
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(keys))
    counted = keys[starts] > 0
    starts, count = starts[counted], (ends - starts)[counted]
    kept = count >= config.min_steps
    starts, count = starts[kept], count[kept]
    position = config.quantile * (count - 1)
    low = position.astype(np.int64)
    high = np.where(low + 1 < count, low + 1, low)
    lo, hi = ordered[starts + low], ordered[starts + high]
    return starts // width, keys[starts], lo + (hi - lo) * (position - low), count


def _by_row(
    n: int, rows: Ints, batch: Ints, level: Floats, count: Ints
) -> tuple[Ints, Floats, Ints]:
    """The levels as one row each of `n`, batch sizes ascending, padded with size 0
    and no steps."""
    per_row = np.bincount(rows, minlength=n)
    width = max(1, int(per_row.max(initial=0)))
    column = np.arange(len(rows)) - (np.cumsum(per_row) - per_row)[rows]
    sizes = np.zeros((n, width), dtype=np.int64)
    seconds = np.zeros((n, width), dtype=np.float64)
    steps = np.zeros((n, width), dtype=np.int64)
    sizes[rows, column], seconds[rows, column], steps[rows, column] = batch, level, count
    return sizes, seconds, steps


def _models(
    sizes: Ints, seconds: Floats, steps: Ints, fixed: float, config: SpeedConfig
) -> list[SpeedModel | None]:
    """`speed.model_of_levels` of each row's levels: the line through those with
    `line_steps` (`_lines`), else the pooled part through the size with the most steps,
    the larger on ties (`speed._one_size`), else none."""
    line, fixed_s, per_sample, sloped = _lines(sizes, seconds, steps, config)
    most = steps.max(axis=1)
    tied = steps == most[:, None]
    best = sizes.shape[1] - 1 - np.argmax(tied[:, ::-1], axis=1)  # the largest tied
    picked = np.arange(len(sizes))
    with np.errstate(divide="ignore", invalid="ignore"):  # rows with no level
        one = seconds[picked, best] / (sizes[picked, best] + fixed)
    fixed_s = np.where(line, fixed_s, one * fixed)
    per_sample = np.where(line, per_sample, one)
    fitted = np.where(line, sloped, 1)
    found = (most > 0).tolist()
    rows = zip(fixed_s.tolist(), per_sample.tolist(), fitted.tolist(), found, strict=True)
    return [SpeedModel(f, p, n) if ok else None for f, p, n, ok in rows]


def _lines(
    sizes: Ints, seconds: Floats, steps: Ints, config: SpeedConfig
) -> tuple[Bools, Floats, Floats, Ints]:
    """`speed._line` through each row's levels with `line_steps`: whether there is one,
    its fixed part and slope (Theil-Sen: the median of the slopes of the pairs
    `min_spread` apart, the median of the intercepts; through zero when that is < 0),
    and how many levels it went through."""
    sloped = steps >= config.line_steps  # never a padding: line_steps >= 1
    first, second = np.triu_indices(sizes.shape[1], 1)
    b1, b2 = sizes[:, first], sizes[:, second]
    pairs = sloped[:, first] & sloped[:, second] & (b2 - b1 >= config.min_spread * b2)
    with np.errstate(divide="ignore", invalid="ignore"):
        slopes = (seconds[:, second] - seconds[:, first]) / (b2 - b1)
        slope = _median(np.where(pairs, slopes, np.inf), pairs.sum(axis=1))
        intercept = _median(
            np.where(sloped, seconds - slope[:, None] * sizes, np.inf), sloped.sum(axis=1)
        )
        through_zero = _median(np.where(sloped, seconds / sizes, np.inf), sloped.sum(axis=1))
    line = pairs.any(axis=1) & (slope > 0)
    below = intercept < 0
    fixed_s = np.where(below, 0.0, intercept)
    return line, fixed_s, np.where(below, through_zero, slope), sloped.sum(axis=1)


def _median(values: Floats, count: Ints) -> Floats:
    """`statistics.median` of each row's `count` values (the others +inf, so they sort
    last); meaningless where a row has none."""
    if not values.shape[1]:
        return np.full(len(values), np.nan)
    ordered = np.sort(values, axis=1)
    picked = np.arange(len(values))
    upper = ordered[picked, np.minimum(count // 2, values.shape[1] - 1)]
    lower = ordered[picked, np.maximum(count // 2 - 1, 0)]
    return np.where(count % 2 == 1, upper, (lower + upper) / 2)


__all__ = ["Bools", "fit_any_sizes"]
