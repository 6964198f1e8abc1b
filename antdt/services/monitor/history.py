"""A rank's recent steps at one speed, as its speed model reads them. Pure, no clock.

Every rank's history of a job is a row of one block (`Histories`): two ring buffers of
`maxlen` steps (batch sizes, compute times). A step of many ranks joins in a few numpy
calls (`Histories.add`) and a health fits every rank's one-batch model over the block
at once (fits.py), with no history copied into Python objects: at 10,000 ranks the
copies were most of a health. A rank's own reads (a fit of the general path, the span
around a change of batch size) copy its row out."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from operator import attrgetter, ne
from typing import Any, overload

import numpy as np
import numpy.typing as npt

Step = tuple[int, float]  # (samples, compute_s)
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
Floats = npt.NDArray[np.float64]


class Histories:
    """Rows of up to `maxlen` steps, each a ring buffer: `head` the slot its next step
    takes, `held` how many steps it holds (the latest, just before `head`), `entered`
    how many ever joined it (where a step lies, whatever left since), `changed` where
    its latest change of batch size joined (counted as `entered`: the step whose size
    differs from the one that joined before it; -1: none)."""

    __slots__ = (
        *("changed", "changed_view", "entered", "head", "held", "maxlen", "samples"),
        *("times", "views"),
    )

    def __init__(self, rows: int, maxlen: int) -> None:
        if maxlen < 1:
            raise ValueError("maxlen must be >= 1")
        self.maxlen = maxlen
        self.samples: Ints = np.zeros((rows, maxlen), dtype=np.int64)
        self.times: Floats = np.zeros((rows, maxlen), dtype=np.float64)
        self.head: Ints = np.zeros(rows, dtype=np.int64)
        self.held: Ints = np.zeros(rows, dtype=np.int64)
        self.entered: Ints = np.zeros(rows, dtype=np.int64)
        self.changed: Ints = np.full(rows, -1, dtype=np.int64)
        self.changed_view = self.changed.data
        #: the five arrays as memoryviews: one rank's read or write of an element costs a
        #: third of numpy's (an event of one rank adds a step through them)
        self.views: tuple[memoryview, ...] = tuple(
            a.data for a in (self.samples, self.times, self.head, self.held, self.entered)
        )

    def row(self, index: int) -> History:
        """Row `index` as a rank's History."""
        return History(self.maxlen, block=self, row=index)

    def add(
        self, rows: Ints, samples: Sequence[int] | Ints, times: Sequence[float] | Floats
    ) -> None:
        """One step more for each of `rows` (distinct), its oldest leaving when full."""
        head, entered = self.head[rows], self.entered[rows]
        before = self.samples[rows, head - 1]  # the step that joined last (slot -1: the end)
        changed = (entered > 0) & (before != samples)
        self.changed[rows[changed]] = entered[changed]
        self.samples[rows, head] = samples
        self.times[rows, head] = times
        head += 1
        head[head == self.maxlen] = 0
        self.head[rows] = head
        self.held[rows] = np.minimum(self.held[rows] + 1, self.maxlen)
        self.entered[rows] += 1

    def in_order(self, rows: Ints) -> tuple[Ints, Floats, Ints]:
        """The rows' batch sizes and times oldest first, `maxlen` columns each (a row's
        first `held` are its steps), and how many each holds."""
        held, width = self.held[rows], self.maxlen
        start = (self.head[rows] - held) % width
        slots = start[:, None] + np.arange(width)
        slots[slots >= width] -= width
        slots += (rows * width)[:, None]  # flat: one index array takes at half the cost
        return self.samples.take(slots), self.times.take(slots), held

    def as_held(self, rows: Ints) -> tuple[Ints, Floats, Bools, Ints]:
        """The rows' batch sizes and times as they lie in their rings (whole rows taken
        at once, no index per step), which slots hold no step, and each row's batch
        size of its latest step (meaningless where it holds none): for readers of a row
        as a multiset."""
        width, held, head = self.maxlen, self.held[rows], self.head[rows]
        slot, start, end = np.arange(width), (head - held)[:, None], head[:, None]
        # a row's steps fill [start, end) of its ring, those before slot 0 wrapped to its end
        used = ((slot >= start) & (slot < end)) | (slot >= start + width)
        samples = self.samples.take(rows, axis=0)
        latest = samples[np.arange(len(rows)), head - 1]  # slot -1: the end
        return samples, self.times.take(rows, axis=0), ~used, latest

    def last_changes(self, rows: Ints) -> tuple[Ints, Ints, Ints]:
        """Per row, where its latest change of batch size lies among its steps (the step
        whose size is new, oldest first, the step before it held too; 0: one size
        throughout), how many it holds, and how many ever joined it: read off `changed`,
        with no step copied."""
        held, entered = self.held[rows], self.entered[rows]
        at = self.changed[rows] - (entered - held)
        return np.where(at >= 1, at, 0), held, entered

    def first_and_latest(self, rows: Ints) -> tuple[Ints, Ints, Ints]:
        """The rows' batch sizes of their oldest and latest steps (meaningless where a
        row holds none), and how many each holds."""
        held, head = self.held[rows], self.head[rows]
        first = self.samples[rows, (head - held) % self.maxlen]
        return first, self.samples[rows, (head - 1) % self.maxlen], held


class History(Sequence[Step]):
    """The last `maxlen` (samples, compute_s) steps of a rank, oldest first, read as a
    sequence of such pairs: a row of a job's `Histories` (its own one-row block when
    made alone). `version` changes with every change; `epoch` with every clear and
    every drop of all but the latest steps (`keep_latest`)."""

    __slots__ = ("_block", "_removed", "_row", "epoch")

    def __init__(self, maxlen: int, *, block: Histories | None = None, row: int = 0) -> None:
        self._block = Histories(1, maxlen) if block is None else block
        self._row = row
        self._removed = 0  # changes besides steps joining: steps dropped, clears
        self.epoch = 0

    @property
    def block(self) -> Histories:
        """The block it is a row of, and its row there (`row`)."""
        return self._block

    @property
    def row(self) -> int:
        return self._row

    def add(self, samples: int, compute_s: float) -> None:
        """One step more (the oldest leaves when full)."""
        all_samples, times, heads, held, entered = self._block.views
        r, maxlen = self._row, self._block.maxlen
        head = heads[r]
        if entered[r] and all_samples[r, head - 1 if head else maxlen - 1] != samples:
            self._block.changed_view[r] = entered[r]
        all_samples[r, head] = samples
        times[r, head] = compute_s  # type: ignore[call-overload]  # a float view
        heads[r] = head + 1 if head + 1 < maxlen else 0
        if held[r] < maxlen:
            held[r] += 1
        entered[r] += 1

    @staticmethod
    def any_two_sizes_at_ends(histories: Sequence[History]) -> bool:
        """Some history's oldest and latest steps differ in batch size (`first_and_latest`
        of each compared), over the block at once when they share one."""
        blocks = set(map(_block_of, histories))
        if len(blocks) != 1:
            return any(e and e[0] != e[1] for e in map(History.first_and_latest, histories))
        block = blocks.pop()
        rows = np.fromiter(map(_row_of, histories), dtype=np.int64, count=len(histories))
        first, latest, held = block.first_and_latest(rows)
        return bool(((first != latest) & (held > 0)).any())

    @staticmethod
    def last_change_spans(
        histories: Sequence[History], steps: int
    ) -> list[tuple[int, int, int] | None]:
        """`last_change_span(steps)` of each, over the block at once when they share one
        (a round of windows asks it of every rank while any ran two sizes lately)."""
        blocks = set(map(_block_of, histories))
        if len(blocks) != 1:  # each over its own block
            return [h.last_change_span(steps) for h in histories]
        block = blocks.pop()
        rows = np.fromiter(map(_row_of, histories), dtype=np.int64, count=len(histories))
        change, held, entered = block.last_changes(rows)
        first = entered - held
        starts = (first + np.maximum(0, change - steps)).tolist()
        ends = (first + np.minimum(held, change + steps)).tolist()
        return [
            (h.epoch, start, end) if at else None
            for h, at, start, end in zip(histories, change.tolist(), starts, ends, strict=True)
        ]

    def append(self, step: Step) -> None:
        self.add(*step)

    @property
    def version(self) -> int:
        """Changes with every change: a step added, dropped, or the history cleared."""
        return self._entered() + self._removed

    def _entered(self) -> int:
        """How many steps ever joined it."""
        return self._block.views[4][self._row]  # type: ignore[no-any-return]

    @property
    def samples(self) -> list[int]:
        """The steps' batch sizes, oldest first (a copy)."""
        return self._column(self._block.samples)

    @property
    def times(self) -> list[float]:
        """The steps' compute times, oldest first (a copy)."""
        return self._column(self._block.times)

    def _column(self, column: npt.NDArray[np.generic]) -> list[Any]:
        views, r = self._block.views, self._row
        held, head = views[3][r], views[2][r]
        start = head - held
        if start >= 0:
            return column[r, start:head].tolist()  # type: ignore[no-any-return]
        return column[r, start:].tolist() + column[r, :head].tolist()  # type: ignore[no-any-return]

    @property
    def bad(self) -> int:
        """How many of its times are not measurable (not in (0, inf))."""
        times = self.times
        return len(times) - sum(1 for t in times if 0.0 < t < math.inf)

    def popleft(self) -> Step:
        """Its oldest step, which leaves."""
        all_samples, times, heads, held_v, _ = self._block.views
        r = self._row
        held = held_v[r]
        if not held:
            raise IndexError("pop from an empty history")
        slot = (heads[r] - held) % self._block.maxlen
        held_v[r] = held - 1
        self._removed += 1
        return all_samples[r, slot], times[r, slot]

    def keep_latest(self, count: int) -> None:
        """All but the latest `count` steps leave, as `popleft` one by one would."""
        held, r = self._block.views[3], self._row
        drop = held[r] - max(0, count)
        if drop <= 0:
            return
        held[r] -= drop
        self._removed += drop
        self.epoch += 1

    def first_and_latest(self) -> tuple[int, int] | None:
        """The batch sizes of its oldest and its latest step (None: it has none)."""
        all_samples, _, heads, held_v, _ = self._block.views
        r = self._row
        held, head = held_v[r], heads[r]
        if not held:
            return None
        return all_samples[r, (head - held) % self._block.maxlen], all_samples[r, head - 1]

    def last_change_span(self, steps: int) -> tuple[int, int, int] | None:
        """Up to `steps` steps on either side of its latest change of batch size, as
        (epoch, first, end): steps first..end - 1 of those that ever joined it. The same
        span holds the same steps. None: one batch size throughout."""
        return History.last_change_spans([self], steps)[0]

    def steps_between(self, first: int, end: int) -> list[Step]:
        """Its steps first..end - 1 of those that ever joined it (`last_change_span`)."""
        samples, times = self.samples, self.times
        held = self._entered() - len(samples)  # joined and left before
        start, stop = max(0, first - held), max(0, end - held)
        return list(zip(samples[start:stop], times[start:stop], strict=True))

    @property
    def changes(self) -> int:
        """Steps whose batch size differs from the step's before (0: one size throughout)."""
        samples = self.samples
        return sum(map(ne, itertools.islice(samples, 1, None), samples))

    def one_batch(self) -> int | None:
        """The batch size of every step, when all are measurable at one size (> 0) and
        there is at least one; None otherwise."""
        samples = self.samples
        if not samples or samples.count(samples[0]) != len(samples) or self.bad:
            return None
        return samples[0] if samples[0] > 0 else None

    @property
    def ordered(self) -> list[float]:
        """The measurable times, ascending (a copy)."""
        return sorted(t for t in self.times if 0.0 < t < math.inf)

    def clear(self) -> None:
        self._block.views[3][self._row] = 0
        self._removed += 1
        self.epoch += 1

    def __len__(self) -> int:
        return self._block.views[3][self._row]  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[Step]:
        return zip(self.samples, self.times, strict=True)

    @overload
    def __getitem__(self, index: int) -> Step: ...

    @overload
    def __getitem__(self, index: slice) -> list[Step]: ...

    def __getitem__(self, index: int | slice) -> Step | list[Step]:
        if isinstance(index, slice):
            return list(self)[index]
        return self.samples[index], self.times[index]

    def __repr__(self) -> str:
        return f"History({list(self)!r})"


_block_of, _row_of = attrgetter("_block"), attrgetter("_row")


def one_block(histories: Sequence[History]) -> tuple[Histories, Ints] | None:
    """The block every one of `histories` is a row of, and their rows in order; None
    when they are rows of several blocks (or none is given)."""
    blocks = set(map(_block_of, histories))
    if len(blocks) != 1:
        return None
    rows = np.fromiter(map(_row_of, histories), dtype=np.int64, count=len(histories))
    return blocks.pop(), rows


__all__ = ["Histories", "History", "Step", "one_block"]
