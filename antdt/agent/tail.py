"""An epoch's tail under uneven batches: the ranks that still have data take the share
of those that ran out. Pure; every rank runs the same arithmetic on the same count.

A rank whose plan gives it a few samples a step (an lb-bsp straggler: 1 of 512) still
holds its current shard and its prefetched one when the others run dry, and drained them
at its plan's pace: 250 one-sample steps, about 50 s, at the end of an epoch of the
deploy test. The step's count now also sums the plan's local batches of the ranks that
got all they asked for; the next step each rank asks for its local batch scaled by the
global batch over that sum (no more than its cap), so the steps of a tail stay near the
global batch while the gradient stays the exact mean over the ids computed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class TailCatchUp:
    """How much more than its plan a rank asks for in the next step (`ratio` >= 1)."""

    ratio: float = 1.0

    def ask(self, local_batch: int, cap: int) -> int:
        """The samples to take this step: the plan's, scaled, at most `cap` (never below
        the plan's: a cap smaller than the plan leaves the plan alone)."""
        if self.ratio == 1.0 or local_batch == 0:
            return local_batch
        return max(local_batch, min(cap, math.floor(local_batch * self.ratio)))

    @staticmethod
    def full_share(local_batch: int, asked: int, taken: int) -> int:
        """A rank's slot in the count: its plan's local batch when it got all it asked
        for (it may have more), else 0 (it ran out)."""
        return local_batch if asked > 0 and taken >= asked else 0

    def counted(self, local_batches: Sequence[int], full_sum: int) -> None:
        """The count said `full_sum` (the summed `full_share`s): the next step's ratio.
        1 when no rank ran out, and when all did (the epoch ends with an empty count)."""
        planned = sum(local_batches)
        self.ratio = planned / full_sum if 0 < full_sum < planned else 1.0

    def reset(self) -> None:
        self.ratio = 1.0


def take_cap(local_batches: Sequence[int], max_local_batch: int | None) -> int:
    """The most a rank takes in a tail step: the largest local batch of the plan (one
    rank of the job already runs it), and never past the rank's own memory cap."""
    largest = max(local_batches, default=0)
    return largest if max_local_batch is None else min(largest, max_local_batch)


__all__ = ["TailCatchUp", "take_cap"]
