"""Many ranks' full windows closed at once: what `JobDetector._closed_window` and a quiet
NORMAL judgement (`deviations.advance` of a rank with no incident, the detector's
`_looked`) do to each rank, the same state to the float, in one pass over the ranks'
memories with no call per rank. A synchronous job closes every rank's window in the
same step: at 10,000 ranks the calls one by one were most of a close, and a pass per
field (`map` and `setattr`) cost several times one pass touching each rank's fields
while its object is at hand. Pure, no clock."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import is_not
from typing import NamedTuple

import numpy as np

from antdt.services.monitor.config import DetectorConfig
from antdt.services.monitor.judge import Judgement
from antdt.services.monitor.latest import Ints, LatestSteps
from antdt.services.monitor.ranks import RankMemory
from antdt.services.monitor.windows import WindowStats


class Kept(NamedTuple):
    """The windows a close keeps (measurable, past warm-up), in the order closed."""

    at: list[int]  # their indices in the closing
    stats: list[WindowStats]
    slow_steps: list[int]  # slow steps in each
    opening: list[bool]  # the rank had no incident open


def cleared(
    ranks: Sequence[RankMemory],
    summaries: Sequence[WindowStats | None],
    latest: LatestSteps,
    rows: Ints,
) -> Kept:
    """Each rank's slow steps counted afresh (its window cleared by the caller); a
    window with nothing measurable (no stats) is dropped, one in warm-up (first
    iterations, prefetch filling up: judged by nobody, out of the others' figures)
    counted off; the others become each rank's latest `stats` (their costs, the
    caller's). `rows`: the ranks' rows of `latest`, their block."""
    summarized = np.fromiter(map(is_not, summaries, repeat(None)), bool, len(summaries))
    slow, past_warmup = latest.closing(rows, summarized)
    at = np.flatnonzero(past_warmup).tolist()
    kept = Kept(at, [], slow[past_warmup].tolist(), [])
    for i in at:
        rank, stats = ranks[i], summaries[i]
        rank.stats = stats
        kept.stats.append(stats)  # type: ignore[arg-type]
        kept.opening.append(rank.deviation is None)
    return kept


def cleared_alone(rank: RankMemory, stats: WindowStats | None) -> Kept:
    """`cleared` of one rank (its events out of step with the job's), through its
    attributes: numpy costs more than the work for one row."""
    slow_steps, rank.slow_steps = rank.slow_steps, 0
    if stats is None:
        return Kept([], [], [], [])
    if rank.warmup_left > 0:
        rank.warmup_left -= 1
        return Kept([], [], [], [])
    rank.stats = stats
    return Kept([0], [stats], [slow_steps], [rank.deviation is None])


def quiet_normal(
    ranks: Sequence[RankMemory],
    stats: Sequence[WindowStats],
    judged: Sequence[Judgement],
    config: DetectorConfig,
    slow_at: float,
) -> None:
    """`with_step_times`, `advance` and `_looked` of NORMAL judgements of ranks with no
    incident open: judgement and normal windows kept, streak broken (`_count_normal`); a
    window counted as looking slow when its ratio is `slow_at` or more."""
    normal_below = 1.0 + config.slow_threshold
    for rank, window, judgement in zip(ranks, stats, judged, strict=True):
        ratio = judgement.ratio
        rank.slow_looking = rank.slow_looking + 1 if ratio >= slow_at else 0
        rank.normal_step_s.append(window.step_s)
        rank.judgement = judgement
        rank.had_normal = rank.had_normal or ratio < normal_below
        rank.streak_kind, rank.streak = None, 0


__all__ = ["Kept", "cleared", "cleared_alone", "quiet_normal"]
