"""Many ranks' windows summarized at once: `windows.summarized` of each, the same floats,
over the rows of the job's block of open windows. Pure, no I/O. A synchronous job's
ranks close their windows in the same step: at 1,000 ranks that was 1,000 summaries of
eight rows, one after another."""

from __future__ import annotations

from itertools import repeat
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from antdt.services.monitor.openwindows import OpenWindows
from antdt.services.monitor.reference import ReferenceConfig
from antdt.services.monitor.windows import WindowStats, made_of, summarized

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


class Summaries(NamedTuple):
    """A close's summaries (`summarize_many`): each window's stats, and its costs
    ascending, the next window's before: those summarized together as rows of an array
    (`together` their indices), the others as lists by index."""

    stats: list[WindowStats | None]
    together: Ints
    costs: Floats
    alone: dict[int, list[float]]

    def summary(self, i: int) -> tuple[WindowStats, list[float]] | None:
        """Window i's stats and costs, as `windows.summarized` gives them (None: none)."""
        stats = self.stats[i]
        if stats is None:
            return None
        if i in self.alone:
            return stats, self.alone[i]
        return stats, self.costs[int(np.searchsorted(self.together, i))].tolist()


def summarize_many(
    windows: OpenWindows, rows: Ints, fixed_samples: float, config: ReferenceConfig
) -> Summaries:
    """`summarized` of the open window of each of `rows` of `windows` with its costs
    before, read where they lie. Full windows whose every step is measured, with no
    costs before or a window's worth, go together; any other alone."""
    n, length = len(rows), windows.length
    found: list[WindowStats | None] = [None] * n
    together: list[Ints] = []
    costs: list[Floats] = [np.zeros((0, length))]
    alone_costs: dict[int, list[float]] = {}
    samples, times, count = windows.block(rows)
    block = np.concatenate((samples[:, :, None].astype(np.float64), times), axis=2)
    before, held = windows.costs_before(rows)
    full = count == length
    alone = ~full | ((held != 0) & (held != length))
    for held_length in dict.fromkeys((0, length)):
        members = np.flatnonzero(full & (held == held_length))
        if len(members):
            pace = (fixed_samples, config)
            kept, made = _block_stats_into(block, before, members, held_length, pace, found)
            alone[members[~kept]] = True
            together.append(members[kept])
            costs.append(made)
    for i in np.flatnonzero(alone).tolist():
        steps = windows.row(int(rows[i])).rows()
        summary = summarized(steps, before[i, : held[i]].tolist(), fixed_samples, config)
        if summary is not None:
            found[i], alone_costs[i] = summary
    indices = np.concatenate([np.zeros(0, dtype=np.int64), *together])
    order = np.argsort(indices, kind="stable")
    return Summaries(found, indices[order], np.concatenate(costs)[order], alone_costs)


def _block_stats_into(
    block: Floats,
    before: Floats,
    members: Ints,
    held_length: int,
    pace: tuple[float, ReferenceConfig],
    found: list[WindowStats | None],
) -> tuple[Bools, Floats]:
    """The stats of `members` (rows of `block`, full windows with `held_length` costs
    before each in `before`: none or a window's worth) into `found` at their indices,
    for those whose every step is measured: which were, and their costs ascending."""
    fixed_samples, config = pace
    length = block.shape[1]
    windows = block[members]
    measured = _measured(windows)
    keep = members[measured]
    kept = windows[measured]
    costs_before = before[keep, :held_length] if held_length else None
    made, costs = _block_stats(kept, costs_before, fixed_samples, config.level_quantile)
    columns = (*made.T.tolist(), repeat(length, len(keep)), *_step_figures(kept))
    if len(keep) == len(found):  # every window (keep is ascending): in place at once
        found[:] = made_of(WindowStats, *columns)
    else:
        for i, summary in zip(keep.tolist(), made_of(WindowStats, *columns), strict=True):
            found[i] = summary
    return measured, costs


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


__all__ = ["Summaries", "quantile_sorted_rows", "summarize_many"]
