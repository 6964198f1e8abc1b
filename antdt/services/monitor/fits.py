"""Many ranks' speed models fitted at once: `fit_speed` of each one-batch history, the
same floats, over arrays. Pure, no I/O. A health after a round of windows refits every
rank's model (each history gained a window of steps): at 10,000 ranks that was 10,000
fits of up to 96 times, one after another, each keeping its own times in order.

Only the common history goes together: every step measurable at one batch size, as
long as the others of its group; any other is left to `fit_speed`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from antdt.services.monitor.history import History
from antdt.services.monitor.speed import ONE_BATCH_LIMIT, SpeedConfig, SpeedModel
from antdt.services.monitor.summaries import as_block, quantile_sorted_rows

#: Fewer histories than this of one length are fitted one by one (arrays cost more).
MANY = 16


def fit_one_batch_many(
    histories: Sequence[History], fixed_samples: float, config: SpeedConfig
) -> dict[int, SpeedModel | None]:
    """`fit_speed(histories[i], fixed_samples, config)` by index i, for the histories
    it fits at once (one batch size, every time measurable and within
    `ONE_BATCH_LIMIT`, enough of them of one length); the others are not in it."""
    groups: dict[int, list[int]] = {}
    batches: dict[int, int] = {}
    for i, history in enumerate(histories):
        batch = history.one_batch()
        if batch is not None:
            batches[i] = batch
            groups.setdefault(len(history), []).append(i)
    fitted: dict[int, SpeedModel | None] = {}
    fixed = max(0.0, fixed_samples)
    for length, members in groups.items():
        if len(members) < MANY:
            continue
        if length < config.min_steps:
            fitted.update(dict.fromkeys(members))
            continue
        fitted.update(_fit_group(histories, members, batches, length, fixed, config))
    return fitted


def _fit_group(
    histories: Sequence[History],
    members: list[int],
    batches: dict[int, int],
    length: int,
    fixed: float,
    config: SpeedConfig,
) -> dict[int, SpeedModel]:
    """The group's models (`speed._one_batch_model`, row by row over a sorted block);
    a history holding a time past `ONE_BATCH_LIMIT` is left out (the general path)."""
    times = as_block([histories[i].times for i in members], (len(members), length))
    block = np.sort(times, axis=1)
    level = quantile_sorted_rows(block, config.quantile)
    sizes = np.array([batches[i] for i in members], dtype=np.float64)
    per_sample = level / (sizes + fixed)
    within = (block[:, -1] <= ONE_BATCH_LIMIT).tolist()
    return {
        i: SpeedModel(p * fixed, p, 1)
        for i, p, ok in zip(members, per_sample.tolist(), within, strict=True)
        if ok
    }


__all__ = ["MANY", "fit_one_batch_many"]
