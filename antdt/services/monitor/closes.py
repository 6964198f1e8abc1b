"""Many ranks' full windows closed at once: what `JobDetector._closed_window` and a quiet
NORMAL judgement (`deviations.quiet_normal_window`, the detector's `_looked`) do to each
rank, the same state to the float, over the ranks' memories at C speed (`map`, numpy).
A synchronous job closes every rank's window in the same step: at 10,000 ranks the
calls one by one were most of a close. Pure, no clock."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import compress, repeat
from operator import attrgetter, is_, is_not
from typing import NamedTuple

import numpy as np

from antdt.services.monitor.config import DetectorConfig
from antdt.services.monitor.judge import Judgement
from antdt.services.monitor.ranks import RankMemory
from antdt.services.monitor.windows import WindowStats

_slow_steps = attrgetter("slow_steps")
_warmup = attrgetter("warmup_left")
_deviation, _costs, _ratio = attrgetter("deviation"), attrgetter("costs"), attrgetter("ratio")
_normal_windows, _slow_looking = attrgetter("normal_windows"), attrgetter("slow_looking")
_had_normal = attrgetter("had_normal")


class Kept(NamedTuple):
    """The windows a close keeps (measurable, past warm-up), in the order closed."""

    at: list[int]  # their indices in the closing
    stats: list[WindowStats]
    slow_steps: list[int]  # slow steps in each
    opening: list[bool]  # the rank had no incident open


def cleared(ranks: Sequence[RankMemory], summaries: Sequence[WindowStats | None]) -> Kept:
    """Each rank's slow steps counted afresh (its window cleared by the caller); a
    window with nothing measurable (no stats) is dropped, one in warm-up counted off;
    the others become each rank's latest (`previous` costs, `stats`)."""
    slow = list(map(_slow_steps, ranks))
    _set(ranks, "slow_steps", repeat(0))
    measured = list(map(is_not, summaries, repeat(None)))
    warming = [m and w > 0 for m, w in zip(measured, map(_warmup, ranks), strict=True)]
    for i in compress(range(len(ranks)), warming):
        ranks[i].warmup_left -= 1
    at = [i for i, (m, w) in enumerate(zip(measured, warming, strict=True)) if m and not w]
    kept = [ranks[i] for i in at]
    stats: list[WindowStats] = [summaries[i] for i in at]  # type: ignore[misc]
    _set(kept, "previous", map(_costs, stats))
    _set(kept, "stats", stats)
    opening = list(map(is_, map(_deviation, kept), repeat(None)))
    return Kept(at, stats, [slow[i] for i in at], opening)


def quiet_normal(
    ranks: Sequence[RankMemory],
    stats: Sequence[WindowStats],
    judged: Sequence[Judgement],
    config: DetectorConfig,
    slow_at: float,
) -> None:
    """`quiet_normal_window` and `_looked` of NORMAL judgements of ranks with no
    incident open: judgement and normal windows kept, streak broken; a window counted as
    looking slow when its ratio is `slow_at` or more."""
    ratio = np.fromiter(map(_ratio, judged), dtype=np.float64, count=len(judged))
    looking = np.fromiter(map(_slow_looking, ranks), dtype=np.int64, count=len(ranks))
    _set(ranks, "slow_looking", np.where(ratio >= slow_at, looking + 1, 0).tolist())
    deque(map(deque.append, map(_normal_windows, ranks), stats), maxlen=0)
    _set(ranks, "judgement", judged)
    normal_now = ratio < 1.0 + config.slow_threshold
    had = np.fromiter(map(_had_normal, ranks), dtype=bool, count=len(ranks))
    _set(ranks, "had_normal", (had | normal_now).tolist())
    _set(ranks, "streak_kind", repeat(None))
    _set(ranks, "streak", repeat(0))


def _set(ranks: Sequence[RankMemory], name: str, values: object) -> None:
    """`setattr(rank, name, value)` of each rank and value, at C speed."""
    deque(map(setattr, ranks, repeat(name), values), maxlen=0)  # type: ignore[call-overload]


__all__ = ["Kept", "cleared", "quiet_normal"]
