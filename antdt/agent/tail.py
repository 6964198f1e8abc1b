"""An epoch's tail under uneven batches: the ranks that still have data take the share
of those that ran out. Pure; every rank runs the same arithmetic on the same count.

Why: a rank given a few samples a step still holds its current and prefetched shards
when the others run dry, and would drain them at its plan's pace while the job waits.
The step's count also sums the plan's local batches of the ranks that got all they asked
for; the next step each rank asks for its local batch scaled by the global batch over
that sum (within its cap), so a tail's steps stay near the global batch while the
gradient stays the exact mean over the ids computed.

A rank whose plan gives it 0 samples (a job spec with `min_local_batch=0`) may still hold
some: prefetched, or claimed at its batch before a plan took it to 0. The ledger counts
them in flight until they are trained, so the group could never leave the epoch. The
count also sums how many such ranks hold samples; once no rank with a batch got all it
asked for, those ranks drain them, splitting the global batch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class TailCatchUp:
    """How much more than its plan a rank asks for in the next step (`ratio` >= 1)."""

    ratio: float = 1.0
    draining: int = 0  # ranks the plan gives 0 that drain what they hold (the last count)
    _holding: bool = False  # this rank is one of them
    _planned: tuple[Sequence[int] | None, int] = (None, 0)  # a plan's batches, their sum

    def ask(self, local_batches: Sequence[int], rank: int, max_local_batch: int | None) -> int:
        """The samples `rank` takes this step: the plan's, scaled, at most the plan's
        largest local batch (one rank of the job already runs it) and `max_local_batch`
        (its memory); never below the plan's. A rank the plan gives 0 takes 0, or while
        it drains, its part of the global batch (at least one sample) within those caps."""
        local = local_batches[rank]
        if local == 0:
            return self._drain_ask(local_batches, max_local_batch) if self._holding else 0
        if self.ratio == 1.0:
            return local
        return max(local, min(_cap(local_batches, max_local_batch), math.floor(local * self.ratio)))

    def _drain_ask(self, local_batches: Sequence[int], max_local_batch: int | None) -> int:
        share = max(1, sum(local_batches) // self.draining)
        return min(_cap(local_batches, max_local_batch), share)

    @staticmethod
    def full_share(local_batch: int, asked: int, taken: int) -> int:
        """A rank's slot in the count: its plan's local batch when it got all it asked
        for (it may have more), else 0 (it ran out)."""
        return local_batch if asked > 0 and taken >= asked else 0

    def counted(
        self, local_batches: Sequence[int], full_sum: int, holders: int = 0, mine: int = 0
    ) -> None:
        """The count said `full_sum` (the summed `full_share`s) and `holders` (how many
        ranks the plan gives 0 still hold samples of the epoch after their take; `mine`:
        1 when this rank is one of them): the next step's ratio, 1 when no rank ran out and
        when all did; and whether ranks the plan gives 0 drain what they hold: only once
        no rank with a batch got all it asked for, so a step stays within the global
        batch. While any drains, the epoch is not over (`drains`)."""
        if self._planned[0] is not local_batches:  # once a plan, not a sum every step
            self._planned = (local_batches, sum(local_batches))
        planned = self._planned[1]
        self.ratio = planned / full_sum if 0 < full_sum < planned else 1.0
        self.draining = holders if full_sum == 0 else 0
        self._holding = mine > 0 and self.draining > 0

    @property
    def drains(self) -> bool:
        """Some rank the plan gives 0 takes the samples it holds in the next step: a count
        of zero does not end the epoch."""
        return self.draining > 0

    def reset(self) -> None:
        self.ratio, self.draining, self._holding = 1.0, 0, False


def _cap(local_batches: Sequence[int], max_local_batch: int | None) -> int:
    """The most a rank may take at a tail: the plan's largest local batch (one rank of
    the job already runs it), within the rank's memory."""
    cap = max(local_batches)
    return cap if max_local_batch is None else min(cap, max_local_batch)


__all__ = ["TailCatchUp"]
