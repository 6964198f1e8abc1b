"""Many ranks' speed models fitted at once: `fit_speed` of each history, the same
floats, over arrays. Pure, no I/O. A health after a round of
windows refits every rank's model (each history gained a window of steps): at 10,000
ranks that was 10,000 fits of up to 96 times, one after another, each keeping its own
times in order; after a plan changed every rank's batch, every history holds two sizes
for as long as it is.

The common histories (every step measurable, in (0, ONE_BATCH_LIMIT], at one or two
batch sizes) take the shortest ways; any other the general one (anysizes.py), but for
a history holding a finite time past ONE_BATCH_LIMIT, left to `fit_speed`. The
histories are read where they lie, rows of their job's block (history.py), with no
copy into Python objects."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain, repeat

import numpy as np

from antdt.services.monitor.anysizes import Bools, fit_any_sizes
from antdt.services.monitor.history import Floats, Histories, History, Ints, one_block
from antdt.services.monitor.speed import (
    ONE_BATCH_LIMIT,
    SpeedConfig,
    SpeedModel,
)
from antdt.services.monitor.windows import made_of

#: Fewer stale histories than this are fitted one by one (arrays cost more).
MANY = 16


def fit_many(
    histories: Sequence[History], fixed_samples: float, config: SpeedConfig
) -> dict[int, SpeedModel | None]:
    """`fit_speed(histories[i], fixed_samples, config)` by index i, for the histories
    it fits at once: all but those holding a finite time past `ONE_BATCH_LIMIT`."""
    fixed = max(0.0, fixed_samples)
    shared = one_block(histories)
    if shared is not None:  # a job's ranks: its one block
        block, rows = shared
        return _fit_rows(block, range(len(histories)), rows, fixed, config)
    by_block: dict[Histories, list[int]] = {}
    for i, history in enumerate(histories):
        by_block.setdefault(history.block, []).append(i)
    fitted: dict[int, SpeedModel | None] = {}
    for block, members in by_block.items():
        rows = np.array([histories[i].row for i in members], dtype=np.int64)
        fitted.update(_fit_rows(block, members, rows, fixed, config))
    return fitted


def _fit_rows(
    block: Histories, members: Sequence[int], rows: np.ndarray, fixed: float, config: SpeedConfig
) -> dict[int, SpeedModel | None]:
    """The models of `rows` of `block` (`members` their indices), each by the cheapest
    way that fits it: one batch size (`_fit_one_size`), exactly two
    (`_fit_two_sizes`), any other (`anysizes.fit_any_sizes`). A row holding a finite
    time past `ONE_BATCH_LIMIT` is left out: `fit_speed`'s sums over it may overflow.
    Every way reads a row's steps as a multiset (levels of sorted times per size,
    counts), so rows are read as they lie in their rings (`Histories.as_held`)."""
    samples, times, unused, latest = block.as_held(rows)
    held = block.held[rows]
    done, models = _fit_one_size((samples, latest), times, (unused, held), fixed, config)
    left = np.ones(len(rows), dtype=np.bool_)
    left[done] = False
    usable = ((times > 0.0) & (times <= ONE_BATCH_LIMIT)) | unused
    two = np.flatnonzero(left & usable.all(axis=1))
    keep, two_models = _fit_two_sizes(samples[two], times[two], unused[two], fixed, config)
    left[two[keep]] = False
    huge = ((times > ONE_BATCH_LIMIT) & (times < np.inf) & ~unused).any(axis=1)
    rest = np.flatnonzero(left & ~huge)
    rest_models = fit_any_sizes(samples[rest], times[rest], unused[rest], fixed, config)
    positions: Iterable[int] = chain(done, two[keep].tolist(), rest.tolist())
    if not isinstance(members, range) or members.start or members.step != 1:
        positions = (members[k] for k in positions)  # else members[k] is k
    return dict(zip(positions, chain(models, two_models, rest_models), strict=True))


def _fit_one_size(
    sizes: tuple[Ints, Ints],
    times: Floats,
    slots: tuple[Bools, Ints],
    fixed: float,
    config: SpeedConfig,
) -> tuple[list[int], list[SpeedModel | None]]:
    """The rows (positions) that hold one batch size, every time measurable and within
    `ONE_BATCH_LIMIT`, and their models: each row's `speed._one_batch_model`, over one
    sort of those rows (unused slots last), whatever each holds. The common history: no
    sort by size. `sizes`: the rows' batch sizes, and each one's latest; `slots`: which
    slots hold no step, and how many steps each row holds."""
    (samples, first), (unused, held) = sizes, slots
    one_size = ((samples == first[:, None]) | unused).all(axis=1)
    measurable = (((times > 0.0) & (times < np.inf)) | unused).all(axis=1)
    one = np.flatnonzero(one_size & measurable & (held > 0) & (first > 0))
    counts = held[one]
    ordered = np.sort(np.where(unused[one], np.inf, times[one]), axis=1)
    level = _quantile_of_first(ordered, counts, config.quantile)
    per_sample = level / (first[one].astype(np.float64) + fixed)
    fitted = counts >= config.min_steps
    within = ordered[np.arange(len(one)), counts - 1] <= ONE_BATCH_LIMIT
    done = ~fitted | within
    p = per_sample[done]
    models: list[SpeedModel | None] = list(
        made_of(SpeedModel, (p * fixed).tolist(), p.tolist(), repeat(1, len(p)))
    )
    for k in np.flatnonzero(~fitted[done]).tolist():
        models[k] = None  # too few steps
    return one[done].tolist(), models


def fit_spans(
    histories: Sequence[History],
    spans: Sequence[tuple[int, int, int]],
    fixed_samples: float,
    config: SpeedConfig,
) -> dict[int, SpeedModel | None]:
    """`fit_speed(histories[i].steps_between(*spans[i][1:]), fixed_samples, config)` by
    index i, for the spans it fits at once: histories of one block, each span holding
    steps, every one measurable and within `ONE_BATCH_LIMIT` (two batch sizes, the
    common span, by `_fit_two_sizes`; any other by `anysizes.fit_any_sizes`); the others
    are not in it. A round of windows refits every rank's model around its last change
    of size."""
    shared = one_block(histories)
    if shared is None:
        return {}
    block, rows = shared
    samples, times, held = block.in_order(rows)
    first = block.entered[rows] - held  # the oldest step held, counted from the first ever
    starts, ends = np.array([span[1:] for span in spans], dtype=np.int64).reshape(-1, 2).T
    low = np.clip(starts - first, 0, held)
    high = np.clip(ends - first, 0, held)
    column = np.arange(block.maxlen)[None, :]
    unused = (column < low[:, None]) | (column >= high[:, None])
    usable = ((times > 0.0) & (times <= ONE_BATCH_LIMIT)) | unused
    candidates = np.flatnonzero(usable.all(axis=1) & (high > low))
    fixed = max(0.0, fixed_samples)
    keep, models = _fit_two_sizes(
        samples[candidates], times[candidates], unused[candidates], fixed, config
    )
    rest = np.delete(candidates, keep)
    models += fit_any_sizes(samples[rest], times[rest], unused[rest], fixed, config)
    return dict(zip(chain(candidates[keep].tolist(), rest.tolist()), models, strict=True))


def _fit_two_sizes(
    samples: Ints, times: Floats, unused: Bools, fixed: float, config: SpeedConfig
) -> tuple[Ints, list[SpeedModel | None]]:
    """`fit_speed` of the rows whose steps (those not `unused`) are at exactly two batch
    sizes (each > 0): the rows kept (indices), and their models. Each size's level over
    the sorted row (`speed._measured_levels`), the model from them as
    `speed.model_of_levels` makes it, over arrays."""
    small = np.where(unused, np.iinfo(np.int64).max, samples).min(axis=1)
    large = np.where(unused, 0, samples).max(axis=1)
    is_small = samples == small[:, None]
    exact = ((is_small | (samples == large[:, None])) | unused).all(axis=1)
    keep = np.flatnonzero(exact & (small > 0) & (small < large))
    small, large, is_small, unused = small[keep], large[keep], is_small[keep], unused[keep]
    times = times[keep]
    levels, counts = [], []
    for mine in (is_small & ~unused, ~is_small & ~unused):
        count = mine.sum(axis=1)
        ordered = np.sort(np.where(mine, times, np.inf), axis=1)
        levels.append(_quantile_of_first(ordered, count, config.quantile))
        counts.append(count)
    return keep, _two_level_models((small, large), levels, counts, fixed, config)


def _two_level_models(
    sizes: tuple[Ints, Ints],
    levels: Sequence[Floats],
    counts: Sequence[Ints],
    fixed: float,
    config: SpeedConfig,
) -> list[SpeedModel | None]:
    """`speed.model_of_levels` of each row's two batch sizes (small < large, each > 0),
    their levels and step counts, over arrays, to the same floats: the line through both
    (Theil-Sen of two points: their slope, the median of their intercepts) when each has
    `line_steps`, they lie `min_spread` apart and it rises; else the pooled fixed part
    through the size with the most steps (the larger on ties) of those with `min_steps`;
    else none."""
    (b1, b2), (t1, t2), (n1, n2) = sizes, levels, counts
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = (t2 - t1) / (b2 - b1)
        sloped = (n1 >= config.line_steps) & (n2 >= config.line_steps)
        line = sloped & (b2 - b1 >= config.min_spread * b2) & (slope > 0)
        intercept = ((t1 - slope * b1) + (t2 - slope * b2)) / 2
        through_zero = (t1 / b1 + t2 / b2) / 2
        found1, found2 = n1 >= config.min_steps, n2 >= config.min_steps
        large = found2 & (~found1 | (n2 >= n1))  # the pooled part through the large size
        level, batch = np.where(large, t2, t1), np.where(large, b2, b1)
        one_size = level / (batch + fixed)
    below = intercept < 0
    fixed_s = np.where(line, np.where(below, 0.0, intercept), one_size * fixed)
    per_sample = np.where(line, np.where(below, through_zero, slope), one_size)
    sizes_fitted = np.where(line, 2, 1)
    fitted = (line | found1 | found2).tolist()
    rows = zip(fixed_s.tolist(), per_sample.tolist(), sizes_fitted.tolist(), fitted, strict=True)
    return [SpeedModel(f, p, n) if ok else None for f, p, n, ok in rows]


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


__all__ = ["MANY", "fit_many", "fit_spans"]
