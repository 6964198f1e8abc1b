"""Work sharing inside a step, simulated: the agents' own offer rule
(`antdt.sharing.offering`, one step late as in a job) decides who offers, and
a water level over the ranks' free times gives the step's compute. Pure: arrays in,
arrays out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from antdt.sharing import Pace, ShareParams, offering
from antdt.sim.cluster import Floats


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


@dataclass
class SharingModel:
    """One job's sharing across the steps: the offers of the last step and the paces
    every rank reported, as the agents keep them."""

    params: ShareParams
    fixed_s: float
    per_sample_s: float
    offered: frozenset[int] = frozenset()
    paces: list[Pace] | None = None

    def step(self, own: Floats, batches: Floats, factors: Floats) -> SharedStep:
        """The step under sharing, given each rank's own share's compute time (`own`),
        batch and speed factor; updates offers and paces."""
        if self.paces is not None:
            counts = batches.astype(int).tolist()
            self.offered = offering(self.paces, self.offered, counts, self.params.ratio)
        if not self.offered:
            paces = zip(own.tolist(), batches.tolist(), strict=True)  # floats: a C-speed pass
            self.paces = [Pace(c / b if b else 0.0) for c, b in paces]
            return SharedStep(float(own.max()), batches, own)
        ranks = np.array(sorted(self.offered))
        micro = np.maximum(1.0, batches[ranks] / self.params.chunks)
        mb = float(micro.mean())
        per_mb = (self.fixed_s + self.per_sample_s * mb) * factors  # every rank, a pool's mb
        rates = mb / per_mb
        starts = own.copy()
        starts[ranks] = 0.0  # the offering ranks compute their own micro-batches at once
        helpers = np.ones(len(own), dtype=bool)
        helpers[ranks] = False
        level = finish_time(starts, rates, float(batches[ranks].sum()))
        pooled = np.maximum(0.0, level - starts)
        # The last micro-batch a rank started ends past the level: half of one at the
        # slowest participant's pace, on average.
        joined = pooled > 0
        tail = 0.5 * float(per_mb[joined].max()) if joined.any() else 0.0
        unshared = float(own[helpers].max()) if helpers.any() else 0.0
        self.paces = self._paces(own, batches, factors, micro, ranks, joined & helpers, mb)
        samples = np.where(helpers, batches, 0.0) + rates * pooled
        busy = np.where(helpers, own, 0.0) + pooled
        # What the agents report: the offering ranks and the helpers, their share in one
        # pass (the agents estimate it; the model knows it).
        one_piece = np.where(joined | ~helpers, own, np.nan)
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
    ) -> list[Pace]:
        mb_pace = (self.fixed_s + self.per_sample_s * mb) * factors / mb
        whole = np.divide(own, batches, out=np.zeros_like(own), where=batches > 0)
        whole[ranks] = (self.fixed_s + self.per_sample_s * micro) * factors[ranks] / micro
        helping = np.where(helped, mb_pace, 0.0)
        return list(map(Pace, whole.tolist(), helping.tolist()))  # floats, at C speed
