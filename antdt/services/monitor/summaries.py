"""Many ranks' windows summarized at once: `summarize` of each, the same floats, over
arrays. Pure, no I/O. A synchronous job's ranks close their windows in the same step:
at 1,000 ranks that was 1,000 summaries of eight rows, one after another."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from antdt.services.monitor.reference import ReferenceConfig
from antdt.services.monitor.windows import Row, StepFigures, WindowStats, summarize

Floats = npt.NDArray[np.float64]


class Summaries(NamedTuple):
    """Each window's `summarize`, and its `step_figures` where it was summarized with
    others (None: to be made when read)."""

    stats: list[WindowStats | None]
    figures: list[StepFigures | None]


def summarize_many(
    windows: Sequence[Sequence[Row]],
    previous: Sequence[Sequence[float]],
    fixed_samples: float,
    config: ReferenceConfig,
) -> Summaries:
    """`summarize(windows[i], previous[i], fixed_samples, config)` for every i. Windows
    of one length whose every step is measured, with no costs before or a window's
    worth, go together (and their `step_figures` are made with them: a health reads
    every rank's after each close); any other alone."""
    found: list[WindowStats | None] = [None] * len(windows)
    figures: list[StepFigures | None] = [None] * len(windows)
    groups: dict[int, list[int]] = {}
    length = len(windows[0]) if windows else 0
    for i, (rows, before) in enumerate(zip(windows, previous, strict=True)):
        if len(rows) == length and len(before) in (0, length):
            groups.setdefault(len(before), []).append(i)
        else:
            found[i] = summarize(rows, before, fixed_samples, config)
    for before_length, members in groups.items():
        block = as_block([windows[i] for i in members], (len(members), length, 5))
        costs_before = as_block([previous[i] for i in members], (len(members), before_length))
        measured = _measured(block)
        for i, ok in zip(members, measured.tolist(), strict=True):
            if not ok:
                found[i] = summarize(windows[i], previous[i], fixed_samples, config)
        keep = np.flatnonzero(measured)
        if len(keep):
            ranks = [members[k] for k in keep.tolist()]
            stats = _block_stats(
                block[keep],
                costs_before[keep] if before_length else None,
                fixed_samples,
                config.level_quantile,
            )
            for i, (made, costs), step in zip(
                ranks, stats, _step_figures(block[keep]), strict=True
            ):
                busy, data, comm, level, window_level, cost = made[1:]
                rows = tuple(windows[i])
                found[i] = WindowStats(
                    made[0], busy, data, comm, level, window_level, cost, tuple(costs), rows
                )
                figures[i] = step
    return Summaries(found, figures)


def as_block(items: Sequence[Sequence[Any]], shape: tuple[int, ...]) -> Floats:
    """Equal-length windows (rows of 5 numbers) or lists of numbers as one array of `shape`:
    their numbers read in one flat pass (`np.array` of nested lists inspects every
    level first: twice the time)."""
    flat: Iterable[Any] = chain.from_iterable(items)
    if len(shape) == 3:
        flat = chain.from_iterable(flat)
    return np.fromiter(flat, dtype=np.float64, count=math.prod(shape)).reshape(shape)


def _measured(block: Floats) -> npt.NDArray[np.bool_]:
    """Per window: every step has samples, compute time and step time above 0 and every
    figure finite (`summarize`'s common window)."""
    samples, times, steps = block[:, :, 0], block[:, :, 1], block[:, :, 4]
    positive = (samples > 0).all(axis=1) & (times > 0).all(axis=1) & (steps > 0).all(axis=1)
    return np.asarray(positive & np.isfinite(block).all(axis=(1, 2)), dtype=np.bool_)


def _block_stats(
    block: Floats, before: Floats | None, fixed_samples: float, q: float
) -> list[tuple[list[float], list[float]]]:
    """Each window's figures (WindowStats' first seven) and its costs ascending."""
    samples, times, data, comm, steps = (block[:, :, k] for k in range(5))
    compute = np.sort(times / samples, axis=1)
    busy = (times + data) / samples
    data_share, comm_share = data / steps, comm / steps
    data_share = np.where(data_share < 1.0, data_share, 1.0)
    comm_share = np.where(comm_share < 1.0, comm_share, 1.0)
    costs = np.sort(times / (samples + fixed_samples), axis=1) if fixed_samples else compute
    compute_per_sample = _median_sorted(compute)
    both = costs if before is None else np.sort(np.concatenate((before, costs), axis=1), axis=1)
    figures = np.column_stack(
        (
            compute_per_sample,
            _median(busy),
            _median(data_share),
            _median(comm_share),
            quantile_sorted_rows(both, q),
            quantile_sorted_rows(costs, q),
            compute_per_sample if costs is compute else _median_sorted(costs),
        )
    )
    return list(zip(figures.tolist(), costs.tolist(), strict=True))


def _step_figures(block: Floats) -> list[StepFigures]:
    """`windows.step_figures` of each window: the same medians (a window of an odd
    length keeps its median batch an int, as there)."""
    samples, compute, comm, steps = block[:, :, 0], block[:, :, 1], block[:, :, 3], block[:, :, 4]
    overhead = (steps - compute) - comm
    overhead = np.where(overhead > 0.0, overhead, 0.0)
    medians = np.column_stack((_median(steps), _median(samples), _median(comm), _median(overhead)))
    odd = block.shape[1] % 2 == 1
    return [StepFigures(s, int(n) if odd else n, m, o) for s, n, m, o in medians.tolist()]


def _median(values: Floats) -> Floats:
    return _median_sorted(np.sort(values, axis=1))


def _median_sorted(ordered: Floats) -> Floats:
    """Per row, `windows._median` of values sorted ascending: the middle one, or the
    mean of the two (their sum over 2.0, as there)."""
    n = ordered.shape[1]
    mid = n // 2
    if n % 2:
        return ordered[:, mid]
    return (ordered[:, mid - 1] + ordered[:, mid]) / 2.0


def quantile_sorted_rows(ordered: Floats, q: float) -> Floats:
    """Per row of a block sorted along its rows, `speed.quantile_sorted`: linear between
    order statistics, the same operations in the same order."""
    n = ordered.shape[1]
    position = q * (n - 1)
    low = int(position)
    high = low + 1 if low + 1 < n else low
    return ordered[:, low] + (ordered[:, high] - ordered[:, low]) * (position - low)


__all__ = ["Summaries", "as_block", "quantile_sorted_rows", "summarize_many"]
