"""An epoch's tail under uneven batches: the ranks that still have data take the share
of those that ran out. Pure; every rank runs the same arithmetic on the same count.

Why: a rank given a few samples a step still holds its current and prefetched shards
when the others run dry, and would drain them at its plan's pace while the job waits.
The step's count also sums the plan's local batches of the ranks that got all they asked
for; the next step each rank asks for its local batch scaled by the global batch over
that sum (within its cap), so a tail's steps stay near the global batch while the
gradient stays the exact mean over the ids computed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class TailCatchUp:
    """How much more than its plan a rank asks for in the next step (`ratio` >= 1)."""

    ratio: float = 1.0
    _planned: tuple[Sequence[int] | None, int] = (None, 0)  # a plan's batches, their sum

    def ask(self, local_batches: Sequence[int], rank: int, max_local_batch: int | None) -> int:
        """The samples `rank` takes this step: the plan's, scaled, at most the plan's
        largest local batch (one rank of the job already runs it) and `max_local_batch`
        (its memory); never below the plan's."""
        local = local_batches[rank]
        if self.ratio == 1.0 or local == 0:
            return local
        cap = max(local_batches)
        if max_local_batch is not None:
            cap = min(cap, max_local_batch)
        return max(local, min(cap, math.floor(local * self.ratio)))

    @staticmethod
    def full_share(local_batch: int, asked: int, taken: int) -> int:
        """A rank's slot in the count: its plan's local batch when it got all it asked
        for (it may have more), else 0 (it ran out)."""
        return local_batch if asked > 0 and taken >= asked else 0

    def counted(self, local_batches: Sequence[int], full_sum: int) -> None:
        """The count said `full_sum` (the summed `full_share`s): the next step's ratio.
        1 when no rank ran out, and when all did (the epoch ends with an empty count)."""
        if self._planned[0] is not local_batches:  # once a plan, not a sum every step
            self._planned = (local_batches, sum(local_batches))
        planned = self._planned[1]
        self.ratio = planned / full_sum if 0 < full_sum < planned else 1.0

    def reset(self) -> None:
        self.ratio = 1.0


__all__ = ["TailCatchUp"]
