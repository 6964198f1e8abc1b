"""Many ranks' windows summarized at once: `summarize` of each, the same floats, over
arrays. Pure, no I/O. A synchronous job's ranks close their windows in the same step:
at 1,000 ranks that was 1,000 summaries of eight rows, one after another."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import chain, repeat
from typing import Any

import numpy as np
import numpy.typing as npt

from antdt.services.monitor.openwindows import OpenWindows
from antdt.services.monitor.reference import ReferenceConfig
from antdt.services.monitor.windows import Row, WindowStats, made_of, summarize

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


def summarize_many(
    windows: OpenWindows,
    rows: Ints,
    previous: Sequence[Sequence[float]],
    fixed_samples: float,
    config: ReferenceConfig,
) -> list[WindowStats | None]:
    """`summarize` of the open window of each of `rows` of `windows`, with `previous[i]`
    the costs before row i's, read where they lie. Full windows whose every step is
    measured, with no costs before or a window's worth, go together; any other alone."""
    n = len(rows)
    found: list[WindowStats | None] = [None] * n
    if not n:
        return found
    samples, times, count = windows.block(rows)
    block = np.concatenate((samples[:, :, None].astype(np.float64), times), axis=2)
    length = windows.length
    full = count == length
    before = np.fromiter(map(len, previous), dtype=np.int64, count=n)
    alone = ~full | ((before != 0) & (before != length))
    for before_length in dict.fromkeys((0, length)):
        members = np.flatnonzero(full & (before == before_length))
        if len(members):
            alone[members] |= ~_block_stats_into(
                block, members, previous, found, fixed_samples, config
            )
    for i in np.flatnonzero(alone).tolist():
        steps = _rows(samples[i, : count[i]].tolist(), times[i, : count[i]].tolist())
        found[i] = summarize(steps, previous[i], fixed_samples, config)
    return found


def _rows(samples: list[int], times: list[list[float]]) -> list[Row]:
    return [(n, c, d, m, s) for n, (c, d, m, s) in zip(samples, times, strict=True)]


def _block_stats_into(
    block: Floats,
    members: Ints,
    previous: Sequence[Sequence[float]],
    found: list[WindowStats | None],
    fixed_samples: float,
    config: ReferenceConfig,
) -> Bools:
    """The stats of `members` (rows of `block`, full windows with as many costs before
    each: none or a window's worth) into `found` at their indices, for those whose every
    step is measured: which were."""
    length, before_length = block.shape[1], len(previous[int(members[0])])
    windows = block[members]
    measured = _measured(windows)
    keep = members[measured]
    if not len(keep):
        return measured
    kept = windows[measured]
    costs_before = None
    if before_length:
        costs_before = as_block([previous[i] for i in keep.tolist()], (len(keep), before_length))
    made, costs = _block_stats(kept, costs_before, fixed_samples, config.level_quantile)
    events = repeat(length, len(keep))
    columns = (*made.T.tolist(), map(tuple, costs.tolist()), events, *_step_figures(kept))
    for i, summary in zip(keep.tolist(), made_of(WindowStats, *columns), strict=True):
        found[i] = summary
    return measured


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
) -> tuple[Floats, Floats]:
    """Each window's figures (WindowStats' first seven, a row each) and its costs
    ascending."""
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
    return figures, costs


def _step_figures(block: Floats) -> list[list[float]]:
    """`windows.step_figures` of each window, as four columns: the same medians (a
    window of an odd length keeps its median batch an int, as there)."""
    samples, compute, comm, steps = block[:, :, 0], block[:, :, 1], block[:, :, 3], block[:, :, 4]
    overhead = (steps - compute) - comm
    overhead = np.where(overhead > 0.0, overhead, 0.0)
    medians = np.column_stack((_median(steps), _median(samples), _median(comm), _median(overhead)))
    step_s, batch, comm_s, overhead_s = medians.T.tolist()
    if block.shape[1] % 2 == 1:
        batch = list(map(int, batch))
    return [step_s, batch, comm_s, overhead_s]


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


__all__ = ["as_block", "quantile_sorted_rows", "summarize_many"]
