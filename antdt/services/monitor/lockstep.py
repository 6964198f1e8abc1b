"""A step of many ranks none of which has anything to resolve, accounted over its
columns (one pass over the ranks' memories, numpy for the blocks and the slow-step
test): the steady state of a synchronous job, every rank at the same step. Pure, no
clock.

`account_plain` does what the detector's row-by-row path does to each row, but the
evidence: it counts down the steps of a batch change settling and hands back the rows
whose evidence must be weighed (a slow step, a score to wear off) and the rows whose
window is full."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from antdt.services.monitor.history import Histories
from antdt.services.monitor.latest import LatestSteps, nans_for_nones
from antdt.services.monitor.openwindows import OpenWindows
from antdt.services.monitor.ranks import RankMemory
from antdt.services.monitor.stepcolumns import (
    Floats,
    Ints,
    StepArrays,
    StepColumns,
)

Bools = npt.NDArray[np.bool_]


class Accounted(NamedTuple):
    """What `account_plain` leaves to the detector: row indices, ascending."""

    weigh: list[int]  # rows whose evidence is to be weighed (`JobDetector._weigh`), none
    # settling after a batch change (their step to settle counted here, as `_weigh` does)
    full: list[int]  # rows whose window is full: to close
    samples: list[int]  # the rows' samples and compute times as judged (one piece)
    compute_s: list[float]


def replanned(
    columns: StepColumns, arrays: StepArrays, memories: Sequence[RankMemory]
) -> list[int] | None:
    """The rows of one step whose plan is not their window's (ascending), when nothing
    else is to resolve in any row (no stall, not exited, its host); else None. A plan
    in force from this step on moves every rank's."""
    if not memories or arrays.step.min() != arrays.step.max():
        return None
    found = []
    rows = zip(memories, arrays.plan_version.tolist(), columns.host, strict=True)
    for i, (memory, plan, host) in enumerate(rows):
        if memory.stall is not None or memory.exited is not None or memory.host != host:
            return None
        if memory.window_plan != plan:
            found.append(i)
    return found


def account_plain(
    columns: tuple[StepColumns, StepArrays],
    memories: Sequence[RankMemory],
    blocks: tuple[Histories, OpenWindows, LatestSteps],
    now: float,
    pace: tuple[float, float, int],
) -> Accounted:
    """Each row into its rank's latest step (times, batch, link), open window and
    history (row r of each of `blocks` is rank r's), rows of distinct ranks
    (`all_acceptable`) with nothing to resolve but a new plan, already applied
    (`replanned`). `pace`: the job's slow step cost, fixed part in samples and window
    length."""
    (c, a), (histories, windows, latest) = columns, blocks
    slow_cost, fixed_samples, window_steps = pace
    samples, compute = _as_judged(c, a)
    n, t = samples.astype(np.float64), compute
    measured = (n > 0) & (t > 0)
    latest.take(a.rank, (a.step, a.ended_at, a.local_batch), now, c.link_rtt_s)
    settling = latest.settle(a.rank, measured)
    scored = latest.score[a.rank] != 0.0
    lengths = windows.add(a.rank, samples, (compute, a.data_wait_s, a.comm_s, a.step_s))
    if measured.all():
        histories.add(a.rank, samples, compute)
    else:
        picked = np.flatnonzero(measured).tolist()
        for i, m, time in zip(
            picked, samples[measured].tolist(), t[measured].tolist(), strict=True
        ):
            memories[i].history.add(m, time)
    slow = t >= slow_cost * (n + fixed_samples)
    weigh = np.flatnonzero(measured & ~settling & (scored | slow)).tolist()
    full = np.flatnonzero(lengths >= window_steps).tolist()
    return Accounted(weigh, full, samples.tolist(), compute.tolist())


def _as_judged(c: StepColumns, a: StepArrays) -> tuple[Ints, Floats]:
    """The rows' samples and compute times, those run in pieces as their planned batch
    in one (`onepiece.judged_in_one_piece`: a one-piece time given, it and the planned
    batch above 0), picked over arrays (copies)."""
    samples, compute = a.samples.copy(), a.compute_s.copy()
    if c.one_piece_s is None:
        return samples, compute
    piece = nans_for_nones(c.one_piece_s)
    judged = (a.local_batch > 0) & (piece > 0)  # False where NaN: none given
    samples[judged] = a.local_batch[judged]
    compute[judged] = piece[judged]
    return samples, compute


__all__ = ["Accounted", "account_plain", "replanned"]
