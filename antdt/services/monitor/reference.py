"""The job's healthy reference and each rank's evidence of being slow. Pure, no clock.

Reference: the median of the faster half of the ranks' levels, each a rank's recent best
(a low quantile of its step costs: interference only adds time), so up to half the ranks
slowing together cannot move it. Evidence: per step, a likelihood-ratio sum (CUSUM) of
"slower than the reference", opening past a threshold that grows with ln(ranks).
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from antdt.services.monitor.speed import quantile


@dataclass(frozen=True)
class ReferenceConfig:
    """Tunables; the defaults suit the shared-core noise of docs/detection.md."""

    level_quantile: float = 0.25  # a rank's level: this quantile of its window's costs
    slow_at: float = 1.2  # a step costing this x the reference or more is a slow step
    healthy_slow_share: float = 0.3  # share of slow steps a healthy rank may show (p0)
    straggler_slow_share: float = 0.9  # share a straggler shows at least (p1)
    open_base: float = 12.5  # evidence that opens, before the ln(ranks) term
    instant_ratio: float = 2.0  # a window's median cost this x the reference: slow at once

    def __post_init__(self) -> None:
        if not 0.0 <= self.level_quantile <= 1.0 or self.slow_at <= 1.0:
            raise ValueError("level_quantile must be in [0, 1] and slow_at > 1")
        if not 0.0 < self.healthy_slow_share < self.straggler_slow_share < 1.0:
            raise ValueError("need 0 < healthy_slow_share < straggler_slow_share < 1")
        if self.open_base <= 0 or self.instant_ratio < self.slow_at:
            raise ValueError("open_base must be > 0 and instant_ratio >= slow_at")

    @functools.cached_property
    def slow_step_weight(self) -> float:
        """Evidence a slow step adds: ln(p1 / p0)."""
        return math.log(self.straggler_slow_share / self.healthy_slow_share)

    @functools.cached_property
    def normal_step_weight(self) -> float:
        """Evidence a normal step adds (negative): ln((1 - p1) / (1 - p0))."""
        return math.log((1.0 - self.straggler_slow_share) / (1.0 - self.healthy_slow_share))

    def open_at(self, ranks: int) -> float:
        """Evidence that opens: each rank's false alarms shrink as 1/ranks, so the job's
        false alarms per step stay the same whatever its size."""
        return self.open_base + math.log(max(ranks, 1))


def rank_level(costs: Sequence[float], config: ReferenceConfig) -> float:
    """A rank's level over its window: the `level_quantile` of its step costs."""
    return quantile(costs, config.level_quantile)


def healthy_reference(levels: Sequence[float], leader_at: float = 0.0) -> float | None:
    """The median of the faster half (ceil(n/2)) of the ranks' levels, leaders left out;
    None under 2 ranks.

    With 2 ranks it is the faster one; a slow half, or a slow host holding up to half the
    ranks, leaves it where the healthy ranks are. A leader (a level under `leader_at` x
    the ranks' lower median) is not the job's healthy pace: in a small job it would
    otherwise pull the reference down and make every other rank look slow."""
    return healthy_reference_sorted(sorted(levels), leader_at)


def healthy_reference_sorted(levels: Sequence[float], leader_at: float = 0.0) -> float | None:
    """`healthy_reference` of levels sorted ascending, in O(log n)."""
    n = len(levels)
    if n < 2:
        return None
    start = bisect.bisect_left(levels, leader_at * levels[(n - 1) // 2]) if leader_at else 0
    half = (n - start + 1) // 2
    mid = start + half // 2
    return levels[mid] if half % 2 else (levels[mid - 1] + levels[mid]) / 2.0


class Evidence(NamedTuple):
    """A rank's accumulated evidence of being slow, in [0, open_at], and its verdict."""

    score: float = 0.0
    slow: bool = False  # set when score reaches open_at, cleared when it is back at 0
    run: int = 0  # steps since the score last left 0: how long the rank has been slow

    def after(
        self, cost: float, reference: float, open_at: float, config: ReferenceConfig
    ) -> Evidence:
        """The evidence after one step costing `cost` against `reference` (> 0). On the
        ingest path for a third of a noisy job's steps: conditionals, not min()/max()."""
        score = self[0]
        if cost >= config.slow_at * reference:
            score += config.slow_step_weight
            if score > open_at:
                score = open_at
        elif score == 0.0:
            return self  # the common case, a normal step of a normal rank: no new tuple
        else:
            score += config.normal_step_weight
            if score <= 0.0:
                return _NONE
        return _new(Evidence, (score, self[1] or score >= open_at, self[2] + 1))

    def after_window(self, ratio: float, open_at: float, config: ReferenceConfig) -> Evidence:
        """The evidence after a window whose median cost is `ratio` x the reference: a
        rank slower by `instant_ratio` in most of a window is slow at once, as a 3x
        straggler (or a burst that long) should be."""
        if ratio >= config.instant_ratio and not self.slow:
            return Evidence(open_at, True, self.run)
        return self


_NONE = Evidence()
_new = tuple.__new__  # Evidence(...) without its Python-level __new__: a call less

__all__ = [
    "Evidence",
    "ReferenceConfig",
    "healthy_reference",
    "healthy_reference_sorted",
    "rank_level",
]
