"""Judging one closed window of one rank against the job's latest windows.

Pure: the Judge keeps each rank's latest figures in sorted multisets, so that the job's
healthy reference (the median of the faster half of the ranks' levels) and "the median
of the other ranks" cost O(log n) per window close. Compute slowness is the rank's
evidence (reference.py); data, communication (its comm share, or its link's round trip
to nats-server) and leaders are judged per window here.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from antdt.schemas import Cause
from antdt.services.monitor.config import DetectorConfig
from antdt.services.monitor.latest import nans_for_nones
from antdt.services.monitor.rankfigures import Figures, RankFigures
from antdt.services.monitor.reference import Evidence, healthy_reference_sorted
from antdt.services.monitor.windows import SortedValues, WindowStats, made_of

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]


class Verdict(enum.Enum):
    UNEVALUATED = "unevaluated"  # no other rank measured yet: nothing to compare with
    NORMAL = "normal"
    SLOW = "slow"
    FAST = "fast"
    FADING = "fading"  # its evidence still says slow, this window looked normal: neither


class Judgement(NamedTuple):
    """The verdict on one window and the figures behind it (a NamedTuple: immutable and
    cheap to build, one per window close; see WindowStats). Costs are per sample plus
    the job's fixed part (`fixed_samples`)."""

    verdict: Verdict
    ratio: float = 1.0  # the window's level over the job's healthy reference
    strong: bool = False  # opens an incident at once (compute: the evidence is enough)
    cause: Cause = Cause.UNKNOWN
    compute_per_sample: float = 0.0  # the window's level (a cost)
    others_per_sample: float = 0.0  # the job's healthy reference (a cost)
    busy_ratio: float = 1.0  # (compute + data wait) per sample over the others' median
    data_share: float = 0.0  # data wait over the step's wall time
    others_data_share: float = 0.0
    comm_share: float = 0.0
    others_comm_share: float = 0.0
    slow_for_steps: int = 0  # steps the rank's evidence of being slow has run
    fixed_samples: float = 0.0  # the job's fixed part per step, in samples
    link_rtt_s: float | None = None  # the rank's round trip to nats-server (None: unknown)
    others_link_rtt_s: float | None = None  # the other ranks' median of theirs
    step_s: float | None = None  # a communication straggler's: the step time of this window
    step_s_before: float | None = None  # ... and of its normal windows before the onset

    def evidence(self, windows: int) -> dict[str, float]:
        figures = {
            "ratio": self.ratio,
            "compute_s_per_sample": self.compute_per_sample,
            "others_compute_s_per_sample": self.others_per_sample,
            "busy_ratio": self.busy_ratio,
            "data_wait_share": self.data_share,
            "others_data_wait_share": self.others_data_share,
            "comm_share": self.comm_share,
            "others_comm_share": self.others_comm_share,
            "slow_for_steps": float(self.slow_for_steps),
            "fixed_samples": self.fixed_samples,
            "windows": float(windows),
        }
        optional = {
            "link_rtt_s": self.link_rtt_s,
            "others_link_rtt_s": self.others_link_rtt_s,
            "step_s": self.step_s,
            "step_s_before": self.step_s_before,
        }
        figures.update((k, v) for k, v in optional.items() if v is not None)
        return figures


class Judge:
    """Latest window figures of every measured rank, and the rules that compare them.

    Windows are judged against the figures as they stood when the job's current step
    began: a window closing now is queued (`queue`) and joins the multisets at the
    next `renew` (the detector renews at the first event of each later step). So every
    window of a step meets the same figures whatever order its events arrive in, and a
    step's windows can be judged together."""

    def __init__(self, config: DetectorConfig, ranks: int = 0) -> None:
        self.config = config
        self._levels = SortedValues()
        self._busy = SortedValues()
        self._data_share = SortedValues()
        self._comm_share = SortedValues()
        self._link_rtt = SortedValues()  # of the ranks that measured theirs
        # per rank, its figures in the multisets and those closed since (`ranks`: rows
        # made at once; more grow as ranks come)
        self._figures = RankFigures(ranks)
        self._reference: float | None = None

    def queue(self, rank: int, new: WindowStats, link_rtt_s: float | None = None) -> None:
        """A rank's new window and latest link round trip, for the next `renew`. A rank
        closing again before it (its events ahead of the job's) replaces its own."""
        figures = self._figures
        if figures.is_queued(rank):
            self._hold(rank, figures.unqueue(rank))
        figures.queue_one(
            rank, (new.level, new.busy_per_sample, new.data_share, new.comm_share, link_rtt_s)
        )

    def queue_many(
        self, ranks: Sequence[int], stats: Sequence[WindowStats], links: Sequence[float | None]
    ) -> None:
        """`queue` of each rank's window and link round trip, in order."""
        if not ranks:
            return
        figures, rows = self._figures, np.asarray(ranks, dtype=np.int64)
        figures.grow(int(rows.max()))
        for rank in rows[figures.queued[rows]].tolist():
            self._hold(rank, figures.unqueue(rank))
        columns = (*(_column(stats, k) for k in _HELD_FIELDS), nans_for_nones(links))
        figures.queue_many(rows, np.column_stack(columns))

    def renew(self) -> bool:
        """The windows queued join the multisets and the reference is renewed; False
        when none was queued (nothing changed)."""
        figures = self._figures
        if not figures.waiting:
            return False
        if figures.waiting * _REBUILD_SHARE < figures.holders:
            for rank in np.flatnonzero(figures.queued).tolist():
                self._hold(rank, figures.unqueue(rank))
        else:  # most ranks closed: the multisets sorted afresh, not swapped rank by rank
            figures.hold_queued()
            for at, values in enumerate(self._sets()):
                values.reset_array(figures.held_column(at))
        self._reference = healthy_reference_sorted(
            self._levels.values, 1.0 - self.config.slow_threshold
        )
        return True

    def _sets(self) -> tuple[SortedValues, ...]:
        """The multisets, in the order of a rank's figures."""
        return (self._levels, self._busy, self._data_share, self._comm_share, self._link_rtt)

    def _hold(self, rank: int, figures: Figures) -> None:
        before = self._figures.held_of(rank)
        for values, was, now in zip(self._sets(), before, figures, strict=True):
            values.replace(was, now)
        self._figures.hold(rank, figures)

    def reference(self) -> float | None:
        """The job's healthy reference cost; None under two measured ranks."""
        return self._reference

    def judge(
        self,
        rank: int,
        stats: WindowStats,
        evidence: Evidence,
        fixed_samples: float,
        link_rtt_s: float | None = None,
    ) -> Judgement:
        """Verdict on the rank's window `stats` and its `link_rtt_s` against the job's
        reference and the other ranks' figures held; compute-slow when the rank's
        `evidence` says so."""
        reference = self._reference
        if reference is None or reference <= 0:
            return Judgement(Verdict.UNEVALUATED, compute_per_sample=stats.window_level)
        held = self._figures.held_of(rank)
        others_busy = _others(self._busy, held[1]) or stats.busy_per_sample
        figures = Judgement(
            Verdict.NORMAL,
            ratio=stats.window_level / reference,
            compute_per_sample=stats.window_level,
            others_per_sample=reference,
            busy_ratio=stats.busy_per_sample / others_busy,
            data_share=stats.data_share,
            others_data_share=_others(self._data_share, held[2]) or 0.0,
            comm_share=stats.comm_share,
            others_comm_share=_others(self._comm_share, held[3]) or 0.0,
            slow_for_steps=evidence.run,
            fixed_samples=fixed_samples,
            link_rtt_s=link_rtt_s,
            others_link_rtt_s=None if link_rtt_s is None else _others(self._link_rtt, held[4]),
        )
        slow = self._slow(figures, evidence.slow)
        return slow or self._fast(figures, stats.level, held[0]) or figures

    def judge_many(
        self,
        ranks: Sequence[int],
        stats: Sequence[WindowStats],
        evidence: Sequence[Evidence],
        fixed_samples: float,
        link_rtt_s: Sequence[float | None],
    ) -> list[Judgement]:
        """`judge` of each rank's window, its figures made over arrays: a step's windows
        all meet the same multisets. The rules run only where one may fire (a slow
        evidence, or the first test of a rule passed); the others' verdict is normal."""
        reference = self._reference
        if len(ranks) < _MANY or reference is None or reference <= 0:
            each = zip(ranks, stats, evidence, link_rtt_s, strict=True)
            return [self.judge(r, w, e, fixed_samples, link) for r, w, e, link in each]
        rows = np.asarray(ranks, dtype=np.int64)
        self._figures.grow(int(rows.max()))
        held = self._figures.held[rows]  # NaN: none held
        window_level, busy, data, comm = (_column(stats, k) for k in (5, 1, 2, 3))
        others_busy = self._busy.medians_without(held[:, 1])
        others_busy = np.where(np.isnan(others_busy) | (others_busy == 0.0), busy, others_busy)
        others_data = _or_zero(self._data_share.medians_without(held[:, 2]))
        others_comm = _or_zero(self._comm_share.medians_without(held[:, 3]))
        others_link = self._link_rtt.medians_without(held[:, 4]).tolist()
        ratio, busy_ratio = window_level / reference, busy / others_busy
        n, normal, unknown = len(ranks), Verdict.NORMAL, Cause.UNKNOWN
        link_others = [  # NaN: none
            None if link is None or others != others else others
            for link, others in zip(link_rtt_s, others_link, strict=True)
        ]
        found = list(
            made_of(
                Judgement,
                *(repeat(normal, n), ratio.tolist(), repeat(False, n), repeat(unknown, n)),
                *(window_level.tolist(), repeat(reference, n), busy_ratio.tolist()),
                *(data.tolist(), others_data.tolist(), comm.tolist(), others_comm.tolist()),
                *(map(_run, evidence), repeat(fixed_samples, n), link_rtt_s, link_others),
                *(repeat(None, n), repeat(None, n)),
            )
        )
        rtt = np.array([math.nan if v is None else v for v in link_rtt_s], dtype=np.float64)
        links = (rtt, np.array(others_link, dtype=np.float64))
        may = self._may_deviate(
            ratio, busy_ratio, (data, others_data), (comm, others_comm), evidence, links
        )
        for i in np.flatnonzero(may).tolist():
            f, held_level = found[i], float(held[i, 0])
            own = None if held_level != held_level else held_level
            found[i] = self._slow(f, evidence[i].slow) or self._fast(f, stats[i].level, own) or f
        return found

    def _may_deviate(
        self,
        ratio: Floats,
        busy_ratio: Floats,
        data: tuple[Floats, Floats],
        comm: tuple[Floats, Floats],
        evidence: Sequence[Evidence],
        link: tuple[Floats, Floats],
    ) -> Bools:
        """Per window, whether `_slow` or `_fast` may give it another verdict than normal:
        the first test of each rule (the evidence's, the data share's, the band of the
        communication and link rules, the leader's ratio) passed."""
        delta = self.config.slow_threshold
        slow_at = 1.0 + delta
        compute_slow = np.fromiter(map(_slow_evidence, evidence), dtype=bool, count=len(ratio))
        data_floor = np.maximum(self.config.data_share_floor, data[1] + (slow_at - 1.0))
        data_slow = (data[0] >= data_floor) & (busy_ratio >= slow_at)
        band = (1.0 - delta < ratio) & (ratio < 1.0 + delta)
        c = self.config
        rtt, others = link
        link_slow = rtt > np.maximum(c.link_rtt_factor * others, others + c.link_rtt_floor_s)
        communication = band & ((comm[0] >= comm[1] + delta) | link_slow)  # NaN: no link
        fast = ratio <= 1.0 - delta
        return compute_slow | data_slow | communication | fast

    def _slow(self, f: Judgement, compute_slow: bool) -> Judgement | None:
        slow_at = 1.0 + self.config.slow_threshold
        instant_at = 1.0 + self.config.instant_threshold
        data_floor = max(self.config.data_share_floor, f.others_data_share + (slow_at - 1.0))
        data_slow = f.data_share >= data_floor and f.busy_ratio >= slow_at
        if compute_slow and not data_slow and f.ratio < slow_at:
            return f._replace(verdict=Verdict.FADING)
        if compute_slow or data_slow:
            # The larger excess names the cause: compute unless data dominates (both over
            # the healthy time before the barrier: busy = compute excess + data excess).
            compute_excess = max(0.0, f.ratio - 1.0)
            data_excess = f.busy_ratio - 1.0 - compute_excess
            cause = Cause.DATA if data_slow and data_excess > compute_excess else Cause.COMPUTE
            strong = compute_slow or f.busy_ratio >= instant_at
            return _with(f, Verdict.SLOW, cause, strong)
        if self._communication_slow(f) or self._link_slow(f):
            return _with(f, Verdict.SLOW, Cause.COMMUNICATION, strong=False)
        return None

    def _communication_slow(self, f: Judgement) -> bool:
        """Abnormal communication share while compute is normal.

        Barrier waits are what every rank shows when some other rank is slow before the
        barrier, so this rule stays silent while any rank's compute+data per sample is
        abnormal (against the faster half's, which a slow half cannot move): the share
        then says who waited, not who is slow.
        """
        delta = self.config.slow_threshold
        if not 1.0 - delta < f.ratio < 1.0 + delta:
            return False
        if f.comm_share < f.others_comm_share + delta:
            return False
        busiest, typical = self._busy.max(), healthy_reference_sorted(self._busy.values)
        return busiest is not None and typical is not None and busiest < (1 + delta) * typical

    def _link_slow(self, f: Judgement) -> bool:
        """Compute normal, and its round trip to nats-server well above the other ranks'
        median: its host's link. In a ring all-reduce a slow link slows every rank's
        exchange alike, so the comm shares cannot say whose link it is; this can."""
        rtt, others = f.link_rtt_s, f.others_link_rtt_s
        if rtt is None or others is None:
            return False
        delta = self.config.slow_threshold
        if not 1.0 - delta < f.ratio < 1.0 + delta:
            return False
        c = self.config
        return rtt > max(c.link_rtt_factor * others, others + c.link_rtt_floor_s)

    def _fast(self, f: Judgement, level: float, held: float | None) -> Judgement | None:
        """A leader: its level well under the other ranks' median (not the reference,
        which a leader itself pulls down in a small job) and under the job's median (in
        a small job one straggler drags "the others'" median up). `held`: the rank's
        level in the multiset (None: none)."""
        fast_at = 1.0 - self.config.slow_threshold
        # Cheapest test first: most windows are nowhere near a leader's (the reference
        # leaves leaders out, so theirs is under fast_at).
        if f.ratio > fast_at or not self.config.leaders or len(self._levels) < 3:
            return None
        others = _others(self._levels, held)
        if not others or level > fast_at * others:
            return None
        job_median = self._levels.median()
        if job_median is None or level > fast_at * job_median:
            return None
        # Never opened in one window: nobody waits for a leader, so a fast window or two
        # of a jittery rank must not open one; `open_windows` fast windows in a row do.
        return _with(f._replace(ratio=level / others), Verdict.FAST, Cause.COMPUTE, False)


#: Queued windows, as a share of the ranks held, from which a renewal sorts afresh: a swap
#: costs a bisection and a move of up to half a multiset, a sort about a swap per rank.
_REBUILD_SHARE = 4

#: The WindowStats fields a rank's figures hold (level, busy per sample, data and comm
#: shares), before its link round trip.
_HELD_FIELDS = (4, 1, 2, 3)


def _column(stats: Sequence[WindowStats], at: int) -> Floats:
    """One figure of every window, as an array."""
    return np.fromiter(map(itemgetter(at), stats), dtype=np.float64, count=len(stats))


def _or_zero(medians: Floats) -> Floats:
    """`median or 0.0` of each: none (NaN) is 0."""
    return np.where(np.isnan(medians), 0.0, medians)


def _slow_evidence(evidence: Evidence) -> bool:
    return evidence.slow


_run = attrgetter("run")
#: Windows judged together from which their figures are made over arrays.
_MANY = 16


def _others(values: SortedValues, held: float | None) -> float | None:
    """The median of the other ranks' figures: without the rank's own when it holds one."""
    return values.median() if held is None else values.median_without(held)


def _with(f: Judgement, verdict: Verdict, cause: Cause, strong: bool) -> Judgement:
    return f._replace(verdict=verdict, cause=cause, strong=strong)


def slow_run(base: Judgement | None, level: float, reference: float, run: int) -> Judgement:
    """The judgement behind an incident its evidence opens between windows: the rank's
    level over its slow run against the reference, the rest of its latest window's."""
    return (base or Judgement(Verdict.NORMAL))._replace(
        verdict=Verdict.SLOW,
        cause=Cause.COMPUTE,
        strong=True,
        ratio=level / reference,
        compute_per_sample=level,
        others_per_sample=reference,
        slow_for_steps=run,
    )
