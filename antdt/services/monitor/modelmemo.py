"""Each rank's speed model as last fitted, and what it was fitted at. Pure, no clock.

A model is as of the rank's latest window, its history and the job's fixed part: it
goes stale when the rank closes a window, its history restarts (a new epoch) or the
fixed part moves. Held as arrays, a health after a close (every rank's window closed)
finds the stale ranks in a few numpy calls instead of a test per rank, and no model
keeps a window's stats alive to compare them by identity."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from antdt.services.monitor.ranks import RankMemory
from antdt.services.monitor.speed import SpeedModel

Ints = npt.NDArray[np.int64]


class ModelMemo:
    """Per rank: its model (`models`, None: too few steps at one speed, or not fitted
    yet), the windows it closed (`closes`, counted by the caller) and the closes,
    history epoch and fixed part its model was fitted at."""

    __slots__ = ("_closes_at", "_epoch_at", "_fixed_at", "closes", "models")

    def __init__(self, ranks: int) -> None:
        self.models: list[SpeedModel | None] = [None] * ranks
        self.closes: Ints = np.zeros(ranks, dtype=np.int64)
        self._closes_at: Ints = np.full(ranks, -1, dtype=np.int64)  # -1: never fitted
        self._epoch_at: Ints = np.full(ranks, -1, dtype=np.int64)
        self._fixed_at = np.full(ranks, np.nan)

    def stale(self, ranks: Sequence[RankMemory], looked: Ints, fixed: float) -> tuple[Ints, Ints]:
        """Those of `looked` (rows of `ranks`) whose model is not of their latest window,
        history and the fixed part `fixed`; with their histories' epochs."""
        epochs = np.fromiter(
            (ranks[i].history.epoch for i in looked.tolist()), dtype=np.int64, count=len(looked)
        )
        old = (
            (self._closes_at[looked] != self.closes[looked])
            | (self._epoch_at[looked] != epochs)
            | (self._fixed_at[looked] != fixed)
        )
        return looked[old], epochs[old]

    def fitted(self, rows: Ints, epochs: Ints, fixed: float) -> None:
        """The models of `rows` (put in `models` by the caller) were fitted now, their
        histories at `epochs`, the job's fixed part at `fixed`."""
        self._closes_at[rows] = self.closes[rows]
        self._epoch_at[rows] = epochs
        self._fixed_at[rows] = fixed

    def fresh(self, rank: RankMemory, fixed: float) -> bool:
        """Whether the rank's model is of its latest window, history and `fixed`."""
        r = rank.rank
        return bool(
            self._closes_at[r] == self.closes[r]
            and self._epoch_at[r] == rank.history.epoch
            and self._fixed_at[r] == fixed
        )


__all__ = ["ModelMemo"]
