"""Many ranks' speed models fitted at once: `fit_speed` of each one-batch history, the
same floats, over arrays. Pure, no I/O. A health after a round of windows refits every
rank's model (each history gained a window of steps): at 10,000 ranks that was 10,000
fits of up to 96 times, one after another, each keeping its own times in order.

Only the common history goes together: every step measurable at one batch size; any
other is left to `fit_speed`. The histories are read where they lie, rows of their
job's block (history.py), with no copy into Python objects."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from antdt.services.monitor.history import Histories, History
from antdt.services.monitor.speed import ONE_BATCH_LIMIT, SpeedConfig, SpeedModel
from antdt.services.monitor.summaries import quantile_sorted_rows

#: Fewer stale histories than this are fitted one by one (arrays cost more).
MANY = 16


def fit_one_batch_many(
    histories: Sequence[History], fixed_samples: float, config: SpeedConfig
) -> dict[int, SpeedModel | None]:
    """`fit_speed(histories[i], fixed_samples, config)` by index i, for the histories
    it fits at once (one batch size, every time measurable and within
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
    return fitted


__all__ = ["MANY", "fit_one_batch_many"]
