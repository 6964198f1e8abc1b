"""Judging one closed window of one rank against the other ranks' latest windows.

Pure: the Judge keeps each rank's latest window figures in sorted multisets so that
"the median of the other ranks" costs O(log n) per window close.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from antdt.schemas import Cause
from antdt.services.monitor.config import DetectorConfig
from antdt.services.monitor.windows import SortedValues, WindowStats


class Verdict(enum.Enum):
    UNEVALUATED = "unevaluated"  # no other rank measured yet: nothing to compare with
    NORMAL = "normal"
    SLOW = "slow"
    FAST = "fast"


class Judgement(NamedTuple):
    """The verdict on one window and the figures behind it (a NamedTuple: immutable and
    cheap to build, one per window close; see WindowStats)."""

    verdict: Verdict
    ratio: float = 1.0  # compute per sample over the other ranks' median
    strong: bool = False  # deviation large enough to open an incident in one window
    cause: Cause = Cause.UNKNOWN
    compute_per_sample: float = 0.0
    others_per_sample: float = 0.0
    busy_ratio: float = 1.0  # (compute + data wait) per sample over the others' median
    data_share: float = 0.0  # data wait over the step's wall time
    others_data_share: float = 0.0
    comm_share: float = 0.0
    others_comm_share: float = 0.0

    def evidence(self, windows: int) -> dict[str, float]:
        return {
            "ratio": self.ratio,
            "compute_s_per_sample": self.compute_per_sample,
            "others_compute_s_per_sample": self.others_per_sample,
            "busy_ratio": self.busy_ratio,
            "data_wait_share": self.data_share,
            "others_data_wait_share": self.others_data_share,
            "comm_share": self.comm_share,
            "others_comm_share": self.others_comm_share,
            "windows": float(windows),
        }


class Judge:
    """Latest window figures of every measured rank, and the rules that compare them."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self._compute = SortedValues()
        self._busy = SortedValues()
        self._data_share = SortedValues()
        self._comm_share = SortedValues()

    def update(self, old: WindowStats | None, new: WindowStats) -> None:
        """Replace a rank's previous window (None: its first) with its new one."""
        sets = (self._compute, self._busy, self._data_share, self._comm_share)
        before_figures: tuple[float | None, ...] = _figures(old) if old else (None,) * len(sets)
        for values, before, after in zip(sets, before_figures, _figures(new), strict=True):
            values.replace(before, after)

    def judge(self, stats: WindowStats) -> Judgement:
        """Verdict on `stats`, which must already be in the multisets (see update)."""
        others = self._compute.median_without(stats.compute_per_sample)
        if others is None or others <= 0:
            return Judgement(Verdict.UNEVALUATED, compute_per_sample=stats.compute_per_sample)
        others_busy = self._busy.median_without(stats.busy_per_sample) or others
        figures = Judgement(
            Verdict.NORMAL,
            ratio=stats.compute_per_sample / others,
            compute_per_sample=stats.compute_per_sample,
            others_per_sample=others,
            busy_ratio=stats.busy_per_sample / others_busy,
            data_share=stats.data_share,
            others_data_share=self._data_share.median_without(stats.data_share) or 0.0,
            comm_share=stats.comm_share,
            others_comm_share=self._comm_share.median_without(stats.comm_share) or 0.0,
        )
        return self._slow(figures, others_busy) or self._fast(figures) or figures

    def _slow(self, f: Judgement, others_busy: float) -> Judgement | None:
        slow_at = 1.0 + self.config.slow_threshold
        instant_at = 1.0 + self.config.instant_threshold
        compute_slow = f.ratio >= slow_at
        data_floor = max(self.config.data_share_floor, f.others_data_share + (slow_at - 1.0))
        data_slow = f.data_share >= data_floor and f.busy_ratio >= slow_at
        if compute_slow or data_slow:
            # The larger excess per sample names the cause: compute unless data dominates.
            compute_excess = f.compute_per_sample - f.others_per_sample
            data_excess = (f.busy_ratio - 1.0) * others_busy - compute_excess
            cause = Cause.DATA if data_slow and data_excess > compute_excess else Cause.COMPUTE
            strong = f.ratio >= instant_at or (data_slow and f.busy_ratio >= instant_at)
            return _with(f, Verdict.SLOW, cause, strong)
        if self._communication_slow(f):
            return _with(f, Verdict.SLOW, Cause.COMMUNICATION, strong=False)
        return None

    def _communication_slow(self, f: Judgement) -> bool:
        """Abnormal communication share while compute is normal.

        Barrier waits are what every rank shows when some other rank is slow before the
        barrier, so this rule stays silent while any rank's compute+data per sample is
        abnormal: the share then says who waited, not who is slow.
        """
        delta = self.config.slow_threshold
        if not 1.0 - delta < f.ratio < 1.0 + delta:
            return False
        if f.comm_share < f.others_comm_share + delta:
            return False
        busiest, typical = self._busy.max(), self._busy.median()
        return busiest is not None and typical is not None and busiest < (1 + delta) * typical

    def _fast(self, f: Judgement) -> Judgement | None:
        delta = self.config.slow_threshold
        # Cheapest test first: most windows are nowhere near a leader's ratio.
        if f.ratio > 1.0 - delta or not self.config.leaders or len(self._compute) < 3:
            return None
        # Against all ranks too: in a small job one straggler drags "the others'" median
        # up, which would make every healthy rank look like a leader.
        job_median = self._compute.median()
        if job_median is None or f.compute_per_sample > (1.0 - delta) * job_median:
            return None
        # Never opened in one window: nobody waits for a leader, so a fast window or two
        # of a jittery rank must not open one; `open_windows` fast windows in a row do.
        return _with(f, Verdict.FAST, Cause.COMPUTE, strong=False)


def _figures(stats: WindowStats) -> tuple[float, ...]:
    """The figures the Judge keeps per rank, in the order of its multisets."""
    return (
        stats.compute_per_sample,
        stats.busy_per_sample,
        stats.data_share,
        stats.comm_share,
    )


def _with(f: Judgement, verdict: Verdict, cause: Cause, strong: bool) -> Judgement:
    return f._replace(verdict=verdict, cause=cause, strong=strong)
