"""Per-rank step-time models: compute_s = fixed_s + per_sample_s x batch. Pure, no clock.

Fitted on a rank's recent steps at a steady speed, one robust level (a quantile) per batch
size it ran, so shared-core noise and a few slow steps do not move it. With one batch size
the fixed part comes from the job's pool (`pooled_fixed_samples`), as a count of samples:
contention slows a rank's fixed and per-sample parts alike, and their ratio stays.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import eq
from typing import NamedTuple

from antdt.services.monitor.history import History


class SpeedModel(NamedTuple):
    """A rank's predicted compute time for a batch: fixed_s + per_sample_s x batch."""

    fixed_s: float  # per-step cost that does not depend on the batch, seconds
    per_sample_s: float  # seconds per sample, > 0
    batch_sizes: int  # distinct batch sizes fitted on; 1: fixed part from the job's pool

    def predict(self, batch: int) -> float:
        """Predicted compute seconds of one step at `batch` samples."""
        return self.fixed_s + self.per_sample_s * batch

    @property
    def fixed_samples(self) -> float:
        """The fixed part in samples: the batch whose per-sample part equals it."""
        return self.fixed_s / self.per_sample_s


@dataclass(frozen=True)
class SpeedConfig:
    """How a model is fitted."""

    min_steps: int = 8  # steps a batch size needs before its level counts
    line_steps: int = 12  # ... and before it counts towards a slope
    min_spread: float = 0.15  # two batch sizes give a slope only this far apart (relative)
    quantile: float = 0.25  # a batch size's level: this quantile of its compute times

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.line_steps:
            raise ValueError("need 1 <= min_steps <= line_steps")
        if self.min_spread <= 0 or not 0.0 <= self.quantile <= 1.0:
            raise ValueError("min_spread must be > 0 and quantile in [0, 1]")


def fit_speed(
    steps: Sequence[tuple[int, float]],
    fixed_samples: float = 0.0,
    config: SpeedConfig | None = None,
) -> SpeedModel | None:
    """The model of one rank from its `(samples, compute_s)` steps, or None (too few).

    The caller passes steps at one speed: it restarts a rank's history when the rank's
    speed changes (an incident opens or resolves, the process restarts). `fixed_samples`:
    the job's pooled fixed part, used when no two batch sizes are far enough apart.
    """
    config = config or _DEFAULT
    if isinstance(steps, History):
        batch = steps.one_batch()
        if batch is not None:  # the common history
            ordered = steps.ordered
            if ordered[-1] <= ONE_BATCH_LIMIT:
                return _one_batch_model(ordered, batch, max(0.0, fixed_samples), config)
    return model_of_levels(_levels(steps, config), fixed_samples, config)


def model_of_levels(
    levels: dict[int, Level], fixed_samples: float, config: SpeedConfig
) -> SpeedModel | None:
    """`fit_speed`'s model from its levels by batch size (those with `min_steps`): the
    line through the sizes with `line_steps`, else the pooled part through one size."""
    if not levels:
        return None
    if len(levels) == 1:  # no slope through one point: the pooled part
        return _one_size(levels, max(0.0, fixed_samples))
    sloped = {b: level for b, level in levels.items() if level.steps >= config.line_steps}
    line = _line(sloped, config.min_spread)
    if line is not None:
        return SpeedModel(line[0], line[1], len(sloped))
    return _one_size(levels, max(0.0, fixed_samples))


def _levels(steps: Sequence[tuple[int, float]], config: SpeedConfig) -> dict[int, Level]:
    """`batch_levels` of `steps` (a History read as its two columns): when every step is
    measurable, each batch size's times picked out in a few C calls, not a loop. A
    health fits every rank's model and a round of windows refits every rank's around
    its last change of size: 10,000 of them at 10,000 ranks."""
    batches: Sequence[int]
    times: Sequence[float]
    if isinstance(steps, History):
        batches, times = steps.samples, steps.times
    else:
        batches, times = tuple(zip(*steps, strict=True)) or ((), ())
    if batches and _measurable(batches, times):
        return _measured_levels(batches, times, config)
    return batch_levels(steps, config)


def _measurable(batches: Sequence[int], times: Sequence[float]) -> bool:
    """Every step has samples and a compute time in (0, inf); the sum is finite only
    when no time is infinite or NaN (a NaN can hide from min)."""
    return min(batches) > 0 and min(times) > 0 and math.isfinite(sum(times))


def _measured_levels(
    batches: Sequence[int], times: Sequence[float], config: SpeedConfig
) -> dict[int, Level]:
    """`batch_levels` of steps each measurable, as columns: each size's times picked
    out at C speed. After a plan changed every rank's batch, every history holds two
    sizes for as long as it is."""
    levels = {}
    for batch in sorted(set(batches)):
        picked = list(compress(times, map(eq, batches, repeat(batch))))
        if len(picked) >= config.min_steps:
            levels[batch] = Level(quantile(picked, config.quantile), len(picked))
    return levels


def _one_batch_model(
    ordered: Sequence[float], batch: int, fixed_samples: float, config: SpeedConfig
) -> SpeedModel | None:
    """`fit_speed` of steps all at `batch` (> 0), their times `ordered` (ascending, each
    measurable): `_one_size` of their one level, in a few operations and no sort. A
    health fits every rank whose history changed: about every rank, every health."""
    if len(ordered) < config.min_steps:
        return None
    per_sample = quantile_sorted(ordered, config.quantile) / (batch + fixed_samples)
    return SpeedModel(per_sample * fixed_samples, per_sample, 1)


#: A one-batch history holding a time past this takes the general path (the sum of its
#: times, which must be finite, might not be).
ONE_BATCH_LIMIT = 1e300


class Level(NamedTuple):
    """The compute time of one batch size (the configured quantile) and its step count."""

    seconds: float
    steps: int


def batch_levels(steps: Iterable[tuple[int, float]], config: SpeedConfig) -> dict[int, Level]:
    """Level per batch size, for the batch sizes with at least `min_steps` steps."""
    by_batch: defaultdict[int, list[float]] = defaultdict(list)
    for samples, compute_s in steps:
        if samples > 0 and compute_s > 0 and math.isfinite(compute_s):
            by_batch[samples].append(compute_s)
    return {
        batch: Level(quantile(times, config.quantile), len(times))
        for batch, times in sorted(by_batch.items())
        if len(times) >= config.min_steps
    }


_DEFAULT = SpeedConfig()


def _line(levels: dict[int, Level], min_spread: float) -> tuple[float, float] | None:
    """(fixed_s, per_sample_s) through the levels (Theil-Sen), or None when no two batch
    sizes are far enough apart or the slope is not positive (noise exceeds the signal)."""
    points = sorted((batch, level.seconds) for batch, level in levels.items())
    slopes = [
        (t2 - t1) / (b2 - b1)
        for i, (b1, t1) in enumerate(points)
        for b2, t2 in points[i + 1 :]
        if b2 - b1 >= min_spread * b2
    ]
    if not slopes:
        return None
    slope = statistics.median(slopes)
    if slope <= 0:
        return None
    fixed = statistics.median(t - slope * b for b, t in points)
    if fixed < 0:  # no fixed part to speak of: the best per-sample fit through zero
        return 0.0, statistics.median(t / b for b, t in points)
    return fixed, slope


def _one_size(levels: dict[int, Level], fixed_samples: float) -> SpeedModel:
    """From the batch size with the most steps (the larger on ties) and the pooled part."""
    batch, level = max(levels.items(), key=lambda item: (item[1].steps, item[0]))
    per_sample = level.seconds / (batch + fixed_samples)
    return SpeedModel(per_sample * fixed_samples, per_sample, 1)


def pooled_fixed_samples(models: Iterable[SpeedModel | None], default: float = 0.0) -> float:
    """The job's fixed part in samples: the median over models fitted on two or more batch
    sizes (pass those of ranks at a steady speed); `default` when there are none."""
    pool = [m.fixed_samples for m in models if m is not None and m.batch_sizes >= 2]
    return statistics.median(pool) if pool else default


def unit_cost(samples: int, compute_s: float, fixed_samples: float) -> float:
    """A step's compute time per sample-equivalent: compute_s / (samples + fixed_samples).

    Equal for ranks of equal speed whatever batch each ran, when `fixed_samples` is the
    job's fixed part; with 0 it is today's compute time per sample."""
    return compute_s / (samples + fixed_samples)


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of `values` (non-empty), linear between order statistics."""
    return quantile_sorted(sorted(values), q)


def quantile_sorted(ordered: Sequence[float], q: float) -> float:
    """`quantile` of values sorted ascending, in O(1)."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = low + 1 if low + 1 < len(ordered) else low
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


__all__ = [
    "ONE_BATCH_LIMIT",
    "Level",
    "SpeedConfig",
    "SpeedModel",
    "batch_levels",
    "fit_speed",
    "model_of_levels",
    "pooled_fixed_samples",
    "quantile",
    "quantile_sorted",
    "unit_cost",
]
