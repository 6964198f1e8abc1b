"""Many ranks' speed models fitted at once: `fit_speed` of each history of one or two
batch sizes, the same floats, over arrays. Pure, no I/O. A health after a round of
windows refits every rank's model (each history gained a window of steps): at 10,000
ranks that was 10,000 fits of up to 96 times, one after another, each keeping its own
times in order; after a plan changed every rank's batch, every history holds two sizes
for as long as it is.

Only the common histories go together: every step measurable (in (0, ONE_BATCH_LIMIT])
at one or two batch sizes; any other is left to `fit_speed`. The histories are read
where they lie, rows of their job's block (history.py), with no copy into Python
objects."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from antdt.services.monitor.history import Floats, Histories, History, Ints
from antdt.services.monitor.speed import (
    ONE_BATCH_LIMIT,
    Level,
    SpeedConfig,
    SpeedModel,
    model_of_levels,
)
from antdt.services.monitor.summaries import quantile_sorted_rows

#: Fewer stale histories than this are fitted one by one (arrays cost more).
MANY = 16


def fit_many(
    histories: Sequence[History], fixed_samples: float, config: SpeedConfig
) -> dict[int, SpeedModel | None]:
    """`fit_speed(histories[i], fixed_samples, config)` by index i, for the histories
    it fits at once (one or two batch sizes, every time measurable and within
    `ONE_BATCH_LIMIT`); the others are not in it."""
    by_block: dict[Histories, list[int]] = {}
    for i, history in enumerate(histories):
        by_block.setdefault(history.block, []).append(i)
    fitted: dict[int, SpeedModel | None] = {}
    fixed = max(0.0, fixed_samples)
    for block, members in by_block.items():
        rows = np.array([histories[i].row for i in members], dtype=np.int64)
        fitted.update(_fit_rows(block, members, rows, fixed, config))
    return fitted


def _fit_rows(
    block: Histories, members: list[int], rows: np.ndarray, fixed: float, config: SpeedConfig
) -> dict[int, SpeedModel | None]:
    """The models of `rows` of `block` (`members` their indices) that hold one batch
    size, every time measurable: those of each length as one sorted block, each row's
    `speed._one_batch_model`; a row holding a time past `ONE_BATCH_LIMIT` is left out
    (the general path)."""
    samples, times, held = block.in_order(rows)
    unused = np.arange(block.maxlen)[None, :] >= held[:, None]
    first = samples[:, 0]
    one_size = ((samples == first[:, None]) | unused).all(axis=1)
    measurable = (((times > 0.0) & (times < np.inf)) | unused).all(axis=1)
    one = np.flatnonzero(one_size & measurable & (held > 0) & (first > 0))
    fitted: dict[int, SpeedModel | None] = {}
    lengths = held[one]
    for length in np.unique(lengths).tolist():
        picked = one[lengths == length]
        if length < config.min_steps:
            fitted.update(dict.fromkeys(members[k] for k in picked.tolist()))
            continue
        ordered = np.sort(times[picked, :length], axis=1)
        level = quantile_sorted_rows(ordered, config.quantile)
        per_sample = level / (first[picked].astype(np.float64) + fixed)
        within = (ordered[:, -1] <= ONE_BATCH_LIMIT).tolist()
        fitted.update(
            (members[k], SpeedModel(p * fixed, p, 1))
            for k, p, ok in zip(picked.tolist(), per_sample.tolist(), within, strict=True)
            if ok
        )
    bounded = ((times <= ONE_BATCH_LIMIT) | unused).all(axis=1)
    two = np.flatnonzero(~one_size & measurable & bounded)
    if len(two):
        rows_of_two = (samples[two], times[two], held[two])
        fitted.update(_fit_two_sizes(*rows_of_two, fixed, config, two, members))
    return fitted


def _fit_two_sizes(
    samples: Ints,
    times: Floats,
    held: Ints,
    fixed: float,
    config: SpeedConfig,
    at: Ints,
    members: list[int],
) -> dict[int, SpeedModel | None]:
    """`fit_speed` of the rows that hold exactly two batch sizes (each > 0): each size's
    level over the sorted row (`speed._measured_levels`), the model from them as
    `fit_speed` makes it (`speed.model_of_levels`)."""
    unused = np.arange(samples.shape[1])[None, :] >= held[:, None]
    small = np.where(unused, np.iinfo(np.int64).max, samples).min(axis=1)
    large = np.where(unused, 0, samples).max(axis=1)
    is_small = samples == small[:, None]
    exact = ((is_small | (samples == large[:, None])) | unused).all(axis=1) & (small > 0)
    keep = np.flatnonzero(exact)
    small, large, is_small, unused = small[keep], large[keep], is_small[keep], unused[keep]
    times = times[keep]
    levels, counts = [], []
    for mine in (is_small & ~unused, ~is_small & ~unused):
        count = mine.sum(axis=1)
        ordered = np.sort(np.where(mine, times, np.inf), axis=1)
        levels.append(_quantile_of_first(ordered, count, config.quantile))
        counts.append(count)
    fitted: dict[int, SpeedModel | None] = {}
    columns = (small, large, *levels, *counts, keep)
    for b1, b2, t1, t2, n1, n2, k in zip(*(c.tolist() for c in columns), strict=True):
        steps = ((b1, t1, n1), (b2, t2, n2))
        found = {b: Level(t, n) for b, t, n in steps if n >= config.min_steps}
        fitted[members[at[k]]] = model_of_levels(found, fixed, config)
    return fitted


def _quantile_of_first(ordered: Floats, count: Ints, q: float) -> Floats:
    """`speed.quantile_sorted` of each row's first `count` values (sorted ascending);
    NaN where a row has none."""
    n = np.maximum(count, 1)
    position = q * (n - 1)
    low = position.astype(np.int64)
    high = np.where(low + 1 < n, low + 1, low)
    rows = np.arange(len(ordered))
    lo, hi = ordered[rows, low], ordered[rows, high]
    level = lo + (hi - lo) * (position - low)
    return np.where(count > 0, level, np.nan)


__all__ = ["MANY", "fit_many"]
