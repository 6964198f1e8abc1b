"""The open windows of a job's ranks, rows of one block. Pure, no clock.

A rank's open window holds up to W steps' figures (`windows.Row`: samples, compute,
data wait, comm and step time) until it closes. Held as Python tuples, a job of 10,000
ranks made and freed ten thousand tuples a step; here a step of many ranks joins in a
few numpy calls (`OpenWindows.add`) and a close summarizes its windows where they lie
(summaries.py). A rank's own event joins through memoryviews (`OpenWindow.append`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from antdt.services.monitor.windows import Row

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]


class OpenWindows:
    """Per row (a rank), up to `length` steps: their samples, their four times (compute,
    data wait, comm, step) and how many it holds (`count`); and the costs of its window
    before, ascending (`before`, the first `held_before`), which the next window's level
    reads: none after a change of batch."""

    __slots__ = ("before", "count", "held_before", "length", "samples", "times", "views")

    def __init__(self, rows: int, length: int) -> None:
        if length < 1:
            raise ValueError("length must be >= 1")
        self.length = length
        self.samples: Ints = np.zeros((rows, length), dtype=np.int64)
        self.times: Floats = np.zeros((rows, length, 4), dtype=np.float64)
        self.count: Ints = np.zeros(rows, dtype=np.int64)
        self.before: Floats = np.zeros((rows, length), dtype=np.float64)
        self.held_before: Ints = np.zeros(rows, dtype=np.int64)
        #: the arrays as memoryviews: one rank's write of an element costs a third of
        #: numpy's (an event of one rank joins its window through them)
        self.views: tuple[memoryview, ...] = tuple(
            a.data for a in (self.samples, self.times, self.count, self.before, self.held_before)
        )

    def row(self, index: int) -> OpenWindow:
        """Row `index` as a rank's OpenWindow."""
        return OpenWindow(self, index)

    def add(
        self,
        rows: Ints,
        samples: Sequence[int] | Ints,
        times: tuple[Floats | Sequence[float], ...],
    ) -> Ints:
        """One step more in each of `rows` (distinct, none full): its samples and its
        compute, data wait, comm and step times. Returns how many each holds now."""
        at = self.count[rows]
        self.samples[rows, at] = samples
        for k, column in enumerate(times):  # a column at a time: no (n, 4) copy made
            self.times[rows, at, k] = column
        at += 1
        self.count[rows] = at
        return at

    def clear(self, rows: Ints) -> None:
        """The windows of `rows` hold nothing."""
        self.count[rows] = 0

    def keep_before(self, rows: Ints, costs: Floats) -> None:
        """Each of `rows` closed its window: its costs (a row of `costs`, `length` each,
        ascending) are the next window's before."""
        self.before[rows] = costs
        self.held_before[rows] = costs.shape[1]

    def costs_before(self, rows: Ints) -> tuple[Floats, Ints]:
        """The rows' costs before (`length` columns; a row's first `held_before` are its
        own) and how many each holds: copies."""
        return self.before[rows], self.held_before[rows]

    def block(self, rows: Ints) -> tuple[Ints, Floats, Ints]:
        """The rows' samples and times (`length` columns each; a row's first `count`
        are its steps), and how many each holds: copies."""
        return self.samples[rows], self.times[rows], self.count[rows]


class OpenWindow:
    """One rank's open window: a row of its job's `OpenWindows` (its own one-row block
    when made alone), read as the sequence of its steps' Rows."""

    __slots__ = ("_block", "_row")

    def __init__(self, block: OpenWindows, row: int = 0) -> None:
        self._block = block
        self._row = row

    @classmethod
    def alone(cls, length: int) -> OpenWindow:
        return cls(OpenWindows(1, length))

    def append(self, row: Row) -> None:
        """One step more (the window must not be full)."""
        samples, times, count = self._block.views[:3]
        r = self._row
        at = count[r]
        samples[r, at] = row[0]
        # four stores written out: a loop over them cost a third of an event's append
        times[r, at, 0] = row[1]  # type: ignore[call-overload]  # a float view
        times[r, at, 1] = row[2]  # type: ignore[call-overload]
        times[r, at, 2] = row[3]  # type: ignore[call-overload]
        times[r, at, 3] = row[4]  # type: ignore[call-overload]
        count[r] = at + 1

    def clear(self) -> None:
        self._block.views[2][self._row] = 0

    def costs_before(self) -> list[float]:
        """The costs of its window before, ascending (none after a change of batch)."""
        block, r = self._block, self._row
        return block.before[r, : block.views[4][r]].tolist()  # type: ignore[no-any-return]

    def keep_costs(self, costs: Sequence[float]) -> None:
        """Its window closed with these costs, ascending (at most `length`)."""
        before, held = self._block.views[3:5]
        r = self._row
        for k, cost in enumerate(costs):
            before[r, k] = cost  # type: ignore[call-overload]  # a float view
        held[r] = len(costs)

    def forget_costs(self) -> None:
        """Its batch changed: the costs before no longer compare."""
        self._block.views[4][self._row] = 0

    def __len__(self) -> int:
        return self._block.views[2][self._row]  # type: ignore[no-any-return]

    def __bool__(self) -> bool:
        return len(self) > 0

    def rows(self) -> list[Row]:
        """Its steps, oldest first (a copy)."""
        block, r = self._block, self._row
        n = len(self)
        samples = block.samples[r, :n].tolist()
        times = block.times[r, :n].tolist()
        return [(s, c, d, m, t) for s, (c, d, m, t) in zip(samples, times, strict=True)]

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, OpenWindow):
            mine, theirs = (self.rows(), self.costs_before()), (other.rows(), other.costs_before())
            return mine == theirs
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


__all__ = ["OpenWindow", "OpenWindows"]
