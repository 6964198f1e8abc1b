"""Work sharing inside a step, simulated: the agents' own offer rule
(`antdt.sharing.offering`, one step late as in a job; here over every rank's paces as
columns, `offering_columns`) decides who offers, and a water level over the ranks' free
times gives the step's compute. Pure: arrays in, arrays out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from antdt.sharing import (
    HEAD_SHARE,
    KEEP_OFFERING_RATIO,
    LATE_RATIO,
    Pace,
    ShareParams,
)
from antdt.sim.cluster import Bools, Floats


def finish_time(starts: Floats, rates: Floats, pool: float) -> float:
    """The time T at which ranks, each free from `starts[r]` and computing `rates[r]`
    samples a second from then on, have computed `pool` samples together:
    sum(rates x max(0, T - starts)) = pool."""
    if pool <= 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, v = starts[order], rates[order]
    rate = np.cumsum(v)
    # Work done by the time the (k+1)-th rank joins, with the first k+1 computing.
    done_at = np.concatenate(([0.0], np.cumsum(rate[:-1] * np.diff(s))))
    k = int(np.searchsorted(done_at, pool, side="right")) - 1
    return float(s[k] + (pool - done_at[k]) / rate[k])


def offering_columns(
    own: Floats,
    helping: Floats,
    offered: Bools,
    samples: Floats,
    ratio: float,
) -> Bools:
    """`antdt.sharing.offering` over every rank's paces as columns (`own`, `helping`:
    seconds per sample, 0 unknown; `offered`: last step's offers as a mask), with no
    claim round trip (a free ticket: any excess over the median is worth offering): the
    same ranks, as a mask. The agents run the rule on their own Pace objects; at
    thousands of ranks the simulator cannot (tests hold the two equal)."""
    scale = one_piece_scale_columns(own, helping, offered)
    judged = (own > 0) & (samples > 0)
    times = np.where(judged, own * np.where(offered, scale, 1.0) * samples, 0.0)
    known = times[judged & (times > 0)]
    if len(known) < 2:
        return np.zeros(len(own), dtype=bool)
    median = float(np.median(known))
    keep = min(ratio, KEEP_OFFERING_RATIO)
    over = times > np.where(offered, keep, ratio) * median
    return judged & over & (times > median)


def one_piece_scale_columns(own: Floats, helping: Floats, offered: Bools) -> float:
    """`antdt.sharing.one_piece_scale` over columns."""
    helped = ~offered & (helping > 0)
    return float(np.median(own[helped] / helping[helped])) if helped.any() else 0.0


def late_pace_limit_columns(own: Floats, ratio: float) -> float | None:
    """`antdt.sharing.late_pace_limit` over the ranks' own paces as a column."""
    known = own[own > 0]
    if len(known) < 2:
        return None
    return max(ratio, LATE_RATIO) * float(np.median(known))


@dataclass(frozen=True)
class SharedStep:
    """A step under sharing: its compute time, and what each rank's step event reports
    (the samples it computed, its own or others', and the seconds it spent on them)."""

    compute_s: float
    samples: Floats
    busy_s: Floats
    #: Per rank, its share's time in one pass when the step ran it otherwise (it offered
    #: or helped; `StepEvent.one_piece_s`), NaN when it ran its share as planned.
    one_piece_s: Floats | None = None


class LateStep(NamedTuple):
    """A step's late decisions: every rank's own time (a decider's in two pieces), its
    head (samples, seconds; 0 where it does not decide) and who offered its tail."""

    own: Floats
    heads: Floats
    head_s: Floats
    offered: Bools


class Paces(NamedTuple):
    """Every rank's seconds per sample in a step (0: none): on its own share, and on the
    micro-batches it took over."""

    own: Floats
    helping: Floats


@dataclass
class SharingModel:
    """One job's sharing across the steps: the offers of the last step and the paces
    every rank reported (None before the first step), as the agents keep them."""

    params: ShareParams
    fixed_s: float
    per_sample_s: float
    offers: Bools = field(default_factory=lambda: np.zeros(0, dtype=bool))
    reported: Paces | None = None

    @property
    def offered(self) -> frozenset[int]:
        """The ranks that offered at the last step's start."""
        return frozenset(np.flatnonzero(self.offers).tolist())

    @property
    def paces(self) -> list[Pace] | None:
        """The last step's paces as the agents hold them."""
        if self.reported is None:
            return None
        return list(map(Pace, self.reported.own.tolist(), self.reported.helping.tolist()))

    def step(
        self, own: Floats, batches: Floats, factors: Floats, deciders: Bools | None = None
    ) -> SharedStep:
        """The step under sharing, given each rank's own share's compute time (`own`),
        batch and speed factor; updates offers and paces. `deciders`: the ranks that
        may offer late (`share_late`), those that compute their share in one piece
        (None: every rank with a batch)."""
        if len(self.offers) != len(own):
            self.offers = np.zeros(len(own), dtype=bool)
        if self.reported is not None:
            samples = np.trunc(batches)
            self.offers = offering_columns(*self.reported, self.offers, samples, self.params.ratio)
        late = self._late(own, batches, factors, deciders)
        if late is not None:
            own = late.own
        if not self.offers.any() and (late is None or not late.offered.any()):
            whole = np.divide(own, batches, out=np.zeros_like(own), where=batches != 0)
            self.reported = Paces(whole, np.zeros(len(own)))
            return SharedStep(float(own.max()), batches, own)
        return self._shared(own, batches, factors, late)

    def _late(
        self, own: Floats, batches: Floats, factors: Floats, deciders: Bools | None
    ) -> LateStep | None:
        """The step's deciders cut in head and tail (`share_late`), and which offer
        their tail; None when late offers are off or no pace is known yet."""
        if not self.params.late or self.reported is None:
            return None
        limit = late_pace_limit_columns(self.reported.own, self.params.ratio)
        may = batches >= 2 if deciders is None else deciders & (batches >= 2)
        may &= ~self.offers
        heads = np.where(may, batches // HEAD_SHARE, 0.0)
        may &= heads > 0  # a share too small to split is computed in one piece
        head_s = np.where(may, (self.fixed_s + self.per_sample_s * heads) * factors, 0.0)
        offered = np.zeros(len(own), dtype=bool)
        if limit is not None:
            offered = may & (head_s > limit * heads)
        # A decider computes its share in two pieces: one more fixed part.
        split = np.where(may & ~offered, own + self.fixed_s * factors, own)
        return LateStep(split, heads, head_s, offered)

    def _shared(
        self, own: Floats, batches: Floats, factors: Floats, late: LateStep | None
    ) -> SharedStep:
        """The step when some rank offers: the pool's water level over every rank's
        free time (an offering rank at once, a late one when its head is done, the
        others when their own share and the step's late decisions are)."""
        early = self.offers
        owners = early | (late.offered if late is not None else False)
        ranks = np.flatnonzero(owners)
        pool_of = np.where(early, batches, 0.0)
        starts = own.copy()
        if late is not None and late.offered.any():
            pool_of = np.where(late.offered, batches - late.heads, pool_of)
            starts = np.maximum(starts, float(late.head_s.max()))  # once all decided
            starts[late.offered] = late.head_s[late.offered]
        starts[early] = 0.0  # the offering ranks compute their own micro-batches at once
        micro_of = np.maximum(1.0, pool_of / self.params.chunks)
        mb = float(micro_of[ranks].mean())
        per_mb = (self.fixed_s + self.per_sample_s * mb) * factors  # every rank, a pool's mb
        rates = mb / per_mb
        helpers = ~owners
        level = finish_time(starts, rates, float(pool_of[ranks].sum()))
        pooled = np.maximum(0.0, level - starts)
        # The last micro-batch a rank started ends past the level: half of one, on
        # average, at the slowest pace among the helpers. An owner leaves its next
        # micro-batch to them when they would finish the rest before it finished that
        # one (`antdt.sharing.holds_back`), so its own pieces end by the level.
        joined = pooled > 0
        last = joined & helpers if (joined & helpers).any() else joined
        tail = 0.5 * float(per_mb[last].max()) if last.any() else 0.0
        unshared = float(own[helpers].max()) if helpers.any() else 0.0
        kept = np.where(helpers, batches, 0.0)
        busy = np.where(helpers, own, 0.0) + pooled
        if late is not None:
            kept = np.where(late.offered, late.heads, kept)
            busy = busy + np.where(late.offered, late.head_s, 0.0)
        first = np.flatnonzero(early)
        paces = self._paces(own, batches, factors, micro_of[first], first, joined & helpers, mb)
        if late is not None and late.offered.any():  # a late offer's pace is its head's
            at = late.offered
            paces.own[at] = late.head_s[at] / late.heads[at]
        self.reported = paces
        samples = kept + rates * pooled
        # What the agents report: the offering ranks and the helpers, their share in one
        # pass (the agents estimate it; the model knows it).
        one_piece = np.where(joined | owners, own, np.nan)
        return SharedStep(max(unshared, level + tail), samples, busy, one_piece)

    def _paces(
        self,
        own: Floats,
        batches: Floats,
        factors: Floats,
        micro: Floats,
        ranks: np.ndarray,
        helped: np.ndarray,
        mb: float,
    ) -> Paces:
        mb_pace = (self.fixed_s + self.per_sample_s * mb) * factors / mb
        whole = np.divide(own, batches, out=np.zeros_like(own), where=batches > 0)
        whole[ranks] = (self.fixed_s + self.per_sample_s * micro) * factors[ranks] / micro
        return Paces(whole, np.where(helped, mb_pace, 0.0))
