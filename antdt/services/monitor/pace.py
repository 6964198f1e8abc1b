"""The job's pace: its healthy reference, its fixed part per step, and each rank's
evidence of being slower than that (pure, no clock).

Per step a rank's cost (compute over samples plus the job's fixed part) adds to its
evidence against the reference; per window the reference is renewed from the ranks'
levels; per round of windows the share of slow steps a healthy rank shows is renewed,
and, while some rank ran two batch sizes lately, the job's fixed part is refitted.
docs/detection.md gives the rules and why.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from antdt.services.monitor.config import DetectorConfig
from antdt.services.monitor.fits import MANY, fit_many, fit_spans
from antdt.services.monitor.history import History
from antdt.services.monitor.modelmemo import ModelMemo
from antdt.services.monitor.ranks import RankMemory
from antdt.services.monitor.reference import rank_level
from antdt.services.monitor.speed import SpeedModel, fit_speed, pooled_fixed_samples
from antdt.services.monitor.windows import WindowStats

Ints = npt.NDArray[np.int64]
_events, _cost = attrgetter("events"), attrgetter("cost")
SHARE_WEIGHT = 0.25  # a window's weight in a rank's smoothed share of slow steps
SHARE_STEP = 0.05  # the healthy share is rounded up to a multiple of this
MAX_HEALTHY_SHARE = 0.6  # ... and kept under this: a straggler's steps are slow >= 90%


class Pace:
    """The job-wide figures a rank's steps are weighed against."""

    __slots__ = (
        *("_changed", "_fitted_at", "_floor", "_speed", "config", "fixed_samples", "open_at"),
        *("_memo", "_share_of", "_shares", "reference", "slow_cost"),
    )

    def __init__(self, config: DetectorConfig, world_size: int) -> None:
        self.config = config.reference  # its healthy_slow_share follows the job's noise
        self._floor = self.config.healthy_slow_share
        self._speed = config.speed
        self.open_at = self.config.open_at(world_size)
        self.reference = 0.0  # the job's healthy cost; 0: not known yet
        self.slow_cost = math.inf  # a step costing this much or more is slow
        self.fixed_samples = 0.0  # the job's fixed part per step, in samples
        # ranks whose window closed or history restarted since `models` last ran (the
        # only models that can have gone stale), and the fixed part and number of ranks
        # it ran with (None: not yet)
        self._changed: set[int] = set()
        self._fitted_at: tuple[float, int] | None = None
        self._memo = ModelMemo(world_size)  # each rank's model, and what it was fitted at
        # each rank's share of its recent steps that were slow (smoothed; NaN: no
        # window yet), and its memoryview (one rank's window)
        self._shares = np.full(world_size, np.nan)
        self._share_of = self._shares.data

    def renewed(self, reference: float | None) -> None:
        """The job's reference was renewed (None while under two ranks are measured):
        the cost of a slow step follows it."""
        if reference is not None and reference > 0:
            self.reference = reference
            self.slow_cost = self.config.slow_at * reference

    def window_closed(self, rank: RankMemory, stats: WindowStats, slow_steps: int) -> None:
        """The rank's window (`stats`, `slow_steps` of its steps slow) closed: its share
        of slow steps, smoothed; its evidence, slow at once when the window's median cost
        is `instant_ratio` x the reference."""
        shares, r = self._share_of, rank.rank
        share, last = slow_steps / stats.events, shares[r]
        shares[r] = share if last != last else last + SHARE_WEIGHT * (share - last)  # type: ignore[call-overload]  # a float view
        self._changed.add(r)
        self._memo.closes[r] += 1
        if self.reference and stats.cost / self.reference >= self.config.instant_ratio:
            self._weigh_window(rank, stats)

    def _weigh_window(self, rank: RankMemory, stats: WindowStats) -> None:
        """The rank's evidence after its window `stats`: slow at once when the window's
        median cost is `instant_ratio` x the reference."""
        before = rank.evidence
        if not self.reference or rank.settle_left or before.slow:
            return
        after = before.after_window(stats.cost / self.reference, self.open_at, self.config)
        if after is not before:
            rank.evidence = after
            self.restart_history(rank)

    def windows_closed(
        self, ranks: Sequence[RankMemory], rows: Ints, stats: Sequence[WindowStats], slow: Ints
    ) -> None:
        """`window_closed` of each rank (`rows` their ranks, `slow` their slow steps) at
        once, the same shares to the float; the evidence weighed only where a window's
        median cost is `instant_ratio` x the reference (a close of a synchronous job is
        all its ranks)."""
        self._changed.update(rows.tolist())
        self._memo.closes[rows] += 1
        events = np.fromiter(map(_events, stats), dtype=np.int64, count=len(stats))
        share, last = slow / events, self._shares[rows]
        self._shares[rows] = np.where(last != last, share, last + SHARE_WEIGHT * (share - last))
        if not self.reference:
            return
        costs = np.fromiter(map(_cost, stats), dtype=np.float64, count=len(stats))
        for i in np.flatnonzero(costs / self.reference >= self.config.instant_ratio).tolist():
            self._weigh_window(ranks[i], stats[i])

    def restart_history(self, rank: RankMemory) -> None:
        """Its evidence turned it slow or back: its speed changed, and its model is
        fitted afresh, from the steps since its evidence started (or from none)."""
        rank.history.keep_latest(rank.evidence.run if rank.evidence.slow else 0)
        self._changed.add(rank.rank)

    def started_afresh(self, rank: RankMemory) -> None:
        """The rank's process started again: its window and history are gone."""
        self._changed.add(rank.rank)

    def run_level(self, rank: RankMemory) -> float:
        """The rank's level over its history (its slow run, once it turned slow)."""
        f = self.fixed_samples
        return rank_level([c / (n + f) for n, c in rank.history], self.config)

    def round(self, ranks: Sequence[RankMemory]) -> None:
        """Once per round of windows (every rank closed one, on average): O(ranks)."""
        self._healthy_share()
        self._refit(ranks)

    def _healthy_share(self) -> None:
        """The share of slow steps a healthy rank shows (the evidence's p0): the lower
        median of the ranks' shares (stragglers, up to half of them, are the upper
        half), never under the configured one. Jitter that is not one-sided (a step as
        often faster as slower) puts more of a healthy rank's steps past slow_at x its
        recent best than a neighbour's hits do; weighed as if it were not, every rank's
        evidence would drift up."""
        shares = np.sort(self._shares[self._shares == self._shares])  # those with a window
        if not len(shares):
            return
        lower_median = float(shares[(len(shares) - 1) // 2])
        wanted = min(MAX_HEALTHY_SHARE, max(self._floor, lower_median))
        wanted = round(math.ceil(wanted / SHARE_STEP - 1e-9) * SHARE_STEP, 6)  # seldom new
        if abs(wanted - self.config.healthy_slow_share) > 1e-9:
            self.config = dataclasses.replace(self.config, healthy_slow_share=wanted)

    def _refit(self, ranks: Sequence[RankMemory]) -> None:
        """The job's fixed part, from the ranks whose history spans two batch sizes. A
        rank's history holds steps at one speed, and contention scales both parts of a
        model, so a straggler's fit counts as much as any."""
        histories = [r.history for r in ranks]
        if not History.any_two_sizes_at_ends(histories):
            return
        spans = History.last_change_spans(histories, _AROUND_CHANGE * self._speed.line_steps)
        self._fit_spans(ranks, spans)
        models = list(map(self._span_model, ranks, spans))
        self.fixed_samples = pooled_fixed_samples(models, self.fixed_samples)

    def _fit_spans(
        self, ranks: Sequence[RankMemory], spans: Sequence[tuple[int, int, int] | None]
    ) -> None:
        """The span models gone stale (`_span_model`), fitted at once where they can be
        (`fits.fit_spans`): after a plan changed every rank's batch, every rank's span
        moves on with each round until it holds its steps on either side."""
        stale = [
            (rank, span)
            for rank, span in zip(ranks, spans, strict=True)
            if span is not None and (rank.span_model is None or rank.span_model[0] != span)
        ]
        if len(stale) < MANY:
            return
        histories = [rank.history for rank, _ in stale]
        chosen = [span for _, span in stale]
        for k, model in fit_spans(histories, chosen, self.fixed_samples, self._speed).items():
            stale[k][0].span_model = (chosen[k], model)

    def _span_model(self, rank: RankMemory, span: tuple[int, int, int] | None) -> SpeedModel | None:
        """The rank's model through `span`, the steps on either side of its history's
        latest change of batch size (`History.last_change_span`), kept while the span
        holds the same steps: the pool reads only models through two sizes, which the
        job's fixed part does not enter. A history of one size has none."""
        if span is None:
            return None
        memo = rank.span_model
        if memo is not None and memo[0] == span:
            return memo[1]
        steps = rank.history.steps_between(span[1], span[2])
        model = fit_speed(steps, self.fixed_samples, self._speed)
        rank.span_model = (span, model)
        return model

    def models(self, ranks: Sequence[RankMemory]) -> list[SpeedModel | None]:
        """`model` of every rank: those whose model is to be fitted afresh, at once where
        they can be (`fits.fit_many`): after a round of windows, every rank. At the fixed
        part of the last call only the ranks changed since are looked at: a slow job's
        health comes up to every step, a window closes every W."""
        fixed, memo = self.fixed_samples, self._memo
        if self._fitted_at != (fixed, len(ranks)):
            looked = np.arange(len(ranks), dtype=np.int64)
        else:
            looked = np.array(sorted(self._changed), dtype=np.int64)
        stale, epochs = memo.stale(ranks, looked, fixed)
        fitted: dict[int, SpeedModel | None] = {}
        if len(stale) >= MANY:
            fitted = fit_many([ranks[i].history for i in stale.tolist()], fixed, self._speed)
        models = memo.models
        for k, i in enumerate(stale.tolist()):
            models[i] = (
                fitted[k] if k in fitted else fit_speed(ranks[i].history, fixed, self._speed)
            )
        memo.fitted(stale, epochs, fixed)
        self._changed.clear()
        self._fitted_at = (fixed, len(ranks))
        return list(models)

    def model(self, rank: RankMemory) -> SpeedModel | None:
        """The rank's step-time model (None: too few steps at one speed yet), fitted at
        the first read after each of its windows closed, its history restarted or the
        job's fixed part changed: like the health's other figures, as of its latest
        window (a health reads every rank's, up to every step of a slow job)."""
        memo, fixed = self._memo, self.fixed_samples
        if not memo.fresh(rank, fixed):
            memo.models[rank.rank] = fit_speed(rank.history, fixed, self._speed)
            row = np.array([rank.rank], dtype=np.int64)
            memo.fitted(row, np.array([rank.history.epoch], dtype=np.int64), fixed)
        return memo.models[rank.rank]


#: The steps a refit reads on either side of a history's latest change of batch size,
#: in line_steps: the two sizes' levels measured as close in time as they can be, so that
#: the job's own drift (a slower phase, the machine's load) does not pass for the batch's
#: effect. A window apart, 3% of drift moved the fixed part of a batch halved from 32 to
#: 17 from 32 samples to 26 or 39.
_AROUND_CHANGE = 2


__all__ = ["Pace"]
