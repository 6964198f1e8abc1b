"""Each rank's latest accepted step, rows of one block. Pure, no clock.

What the detector sets for every rank at every step (the step's number, when it ended,
when it was heard, its batch, its link's round trip) and the steps its evidence still
settles for after a change of batch, what its window's close reads (its slow steps,
the warm-up windows it still ignores) and its evidence's score. Held as attributes of
10,000 objects, a step of 10,000 ranks set 50,000 of them one by one; here it is a few
numpy calls (`LatestSteps.take`). A rank's own reads and writes (RankMemory's
`Column`s, an event of one rank) go through memoryviews. NaN stands for "none yet"
where a time may be missing: the detector refuses NaN in every time it takes."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, repeat
from operator import is_not
from typing import Any, Generic, Protocol, TypeVar, overload

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

#: Positions of the arrays in `LatestSteps.views`.
STEP, ENDED_AT, SEEN_AT, LOCAL_BATCH, LINK_RTT_S, SETTLE_LEFT, SLOW_STEPS, WARMUP_LEFT, SCORE = (
    range(9)
)
T = TypeVar("T")


class LatestSteps:
    """Per row (a rank): its latest step (-1: none yet), when that step ended, when it
    was heard (control-plane time; NaN: never), its local batch, its link's latest round
    trip (NaN: none heard), the steps its evidence still settles for, the slow steps in
    its open window, the measurable windows of its warm-up still to ignore and its
    evidence's score (kept here by `RankMemory.evidence`)."""

    __slots__ = (
        *("ended_at", "link_rtt_s", "local_batch", "seen_at", "settle_left", "step"),
        *("score", "slow_steps", "views", "warmup_left"),
    )

    def __init__(self, rows: int) -> None:
        self.step: Ints = np.full(rows, -1, dtype=np.int64)
        self.ended_at: Floats = np.zeros(rows, dtype=np.float64)
        self.seen_at: Floats = np.full(rows, np.nan)
        self.local_batch: Ints = np.zeros(rows, dtype=np.int64)
        self.link_rtt_s: Floats = np.full(rows, np.nan)
        self.settle_left: Ints = np.zeros(rows, dtype=np.int64)
        self.slow_steps: Ints = np.zeros(rows, dtype=np.int64)
        self.warmup_left: Ints = np.zeros(rows, dtype=np.int64)
        self.score: Floats = np.zeros(rows, dtype=np.float64)
        #: the arrays as memoryviews, in the order of STEP .. SCORE: one rank's
        #: read or write of an element costs a third of numpy's
        self.views: tuple[memoryview, ...] = tuple(
            a.data
            for a in (
                *(self.step, self.ended_at, self.seen_at, self.local_batch),
                *(self.link_rtt_s, self.settle_left, self.slow_steps, self.warmup_left),
                self.score,
            )
        )

    def __len__(self) -> int:
        return len(self.step)

    def take(
        self,
        rows: Ints,
        figures: tuple[Ints, Floats, Ints],
        now: float,
        links: Sequence[float | None] | Floats | None,
    ) -> None:
        """A step of each of `rows` (distinct) accepted at `now`: `figures` its step
        numbers, end times and local batches; `links` the round trips (a row's None or
        NaN, or no column, keeps its last)."""
        step, ended_at, local_batch = figures
        self.step[rows] = step
        self.ended_at[rows] = ended_at
        self.seen_at[rows] = now
        self.local_batch[rows] = local_batch
        if links is None:
            return
        values = nans_for_nones(links)
        given = values == values
        if given.all():
            self.link_rtt_s[rows] = values
        elif given.any():
            self.link_rtt_s[rows[given]] = values[given]

    def links(self, rows: Sequence[int]) -> list[float | None]:
        """The rows' latest round trips (None: none heard)."""
        return list(nones_for_nans(self.link_rtt_s[rows]))

    def settle(self, rows: Ints, measured: Bools) -> Bools:
        """A step less to settle for each of `rows` (distinct) whose step was `measured`
        and is settling: which were."""
        settling = measured & (self.settle_left[rows] > 0)
        self.settle_left[rows[settling]] -= 1
        return settling

    def closing(self, rows: Ints, summarized: Bools) -> tuple[Ints, Bools]:
        """The windows of `rows` (distinct) close (`summarized`: those with stats): each
        row's slow steps, counted afresh; a summarized window in warm-up counted off.
        Their slow steps, and which were past warm-up."""
        slow = self.slow_steps[rows]
        self.slow_steps[rows] = 0
        warming = summarized & (self.warmup_left[rows] > 0)
        self.warmup_left[rows[warming]] -= 1
        return slow, summarized & ~warming


class Row(Protocol):
    """An object whose figures are row `latest_row` of the block `latest`."""

    latest: LatestSteps
    latest_row: int


class Column(Generic[T]):
    """An attribute of a `Row` kept in its block: array `at` of `LatestSteps.views`,
    read and written through its memoryview; `optional`: None is stored as NaN."""

    def __init__(self, at: int, doc: str, *, optional: bool = False) -> None:
        self.at, self.optional, self.__doc__ = at, optional, doc

    @overload
    def __get__(self, row: None, owner: type[Any]) -> Column[T]: ...

    @overload
    def __get__(self, row: Row, owner: type[Any]) -> T: ...

    def __get__(self, row: Row | None, owner: type[Any]) -> Column[T] | T:
        if row is None:
            return self
        value = row.latest.views[self.at][row.latest_row]
        return None if self.optional and value != value else value  # type: ignore[return-value]

    def __set__(self, row: Row, value: T) -> None:
        row.latest.views[self.at][row.latest_row] = np.nan if value is None else value  # type: ignore[call-overload]


def nones_for_nans(column: Sequence[float | None] | Floats) -> Sequence[float | None]:
    """An optional column (`link_rtt_s`, `one_piece_s`) as Python numbers, None where
    a row has none."""
    if not isinstance(column, np.ndarray):
        return column
    listed: list[float | None] = column.tolist()
    for i in np.flatnonzero(np.isnan(column)).tolist():
        listed[i] = None
    return listed


def nans_for_nones(column: Sequence[float | None] | Floats) -> Floats:
    """An optional column (`link_rtt_s`, `one_piece_s`) as floats, NaN where a row has
    none."""
    if isinstance(column, np.ndarray):
        return column.astype(np.float64, copy=False)
    given = np.fromiter(map(is_not, column, repeat(None)), dtype=bool, count=len(column))
    found = np.full(len(column), np.nan)
    if given.any():
        found[given] = np.array(list(compress(column, given)), dtype=np.float64)
    return found


__all__ = ["Column", "LatestSteps", "Row", "nans_for_nones", "nones_for_nans"]
