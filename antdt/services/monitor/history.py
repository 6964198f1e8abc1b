"""A rank's recent steps at one speed, as its speed model reads them. Pure, no clock.

Kept as two columns (batch sizes, compute times), not one tuple per step: an append
costs two deque appends on the ingest path. What a fit reads besides is kept cheaply:
whether one batch size runs through it (a count of changes of size) and its measurable
times in order, brought up to date at the fit from the few steps added and dropped
since the last (a health fits every rank, each history changed by a step or a few: an
insertion per step, not a sort of up to 96 times per rank and health)."""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterator, Sequence
from typing import overload

Step = tuple[int, float]  # (samples, compute_s)

#: Times added and dropped since the last read of `ordered`, per time it holds, beyond
#: which it is sorted afresh (an insertion and a removal cost about a tenth of a sort of
#: 96 times, a sort of 16 about a third as much).
_RESORT_SHARE = 0.25


class History(Sequence[Step]):
    """The last `maxlen` (samples, compute_s) steps, oldest first, read as a sequence of
    such pairs; `version` changes with every change (a fit of an unchanged history is
    kept). `bad`: how many times are not measurable (not in (0, inf))."""

    __slots__ = ("_added", "_changes", "_dropped", "_ordered", "bad", "samples", "times", "version")

    def __init__(self, maxlen: int) -> None:
        self.samples: deque[int] = deque(maxlen=maxlen)
        self.times: deque[float] = deque(maxlen=maxlen)
        self.bad = 0
        self.version = 0
        self._changes = 0  # steps whose batch size differs from the step's before
        self._ordered: list[float] | None = []  # None: to be sorted afresh
        self._added: list[float] = []  # measurable times added since `_ordered` ...
        self._dropped: list[float] = []  # ... and dropped

    def add(self, samples: int, compute_s: float) -> None:
        """One step more (the oldest leaves when full)."""
        times, batches, added = self.times, self.samples, self._added
        if len(times) == times.maxlen:  # the oldest leaves, as popleft() would
            self._left(batches[0], times[0], batches[1] if len(batches) > 1 else None)
        if batches and batches[-1] != samples:
            self._changes += 1
        batches.append(samples)
        times.append(compute_s)
        if not 0.0 < compute_s < math.inf:
            self.bad += 1
        elif len(added) < len(times):
            added.append(compute_s)
        else:  # not read for a while: sorted afresh when read
            self._ordered = None
            added.clear()
            self._dropped.clear()
        self.version += 1

    def append(self, step: Step) -> None:
        self.add(*step)

    def popleft(self) -> Step:
        self.version += 1
        samples, compute_s = self.samples.popleft(), self.times.popleft()
        self._left(samples, compute_s, self.samples[0] if self.samples else None)
        return samples, compute_s

    def _left(self, samples: int, compute_s: float, next_samples: int | None) -> None:
        """The oldest step (`samples`, `compute_s`) leaves; `next_samples`: the batch of
        the step after it (None: none)."""
        if next_samples is not None and next_samples != samples:
            self._changes -= 1
        if 0.0 < compute_s < math.inf:
            self._dropped.append(compute_s)
        else:
            self.bad -= 1

    @property
    def changes(self) -> int:
        """Steps whose batch size differs from the step's before (0: one size throughout)."""
        return self._changes

    def one_batch(self) -> int | None:
        """The batch size of every step, when all are measurable at one size (> 0) and
        there is at least one; None otherwise."""
        if self._changes or self.bad or not self.samples:
            return None
        batch = self.samples[0]
        return batch if batch > 0 else None

    @property
    def ordered(self) -> list[float]:
        """The measurable times, ascending (read only)."""
        ordered, added, dropped, times = self._ordered, self._added, self._dropped, self.times
        if ordered is None or len(added) + len(dropped) > _RESORT_SHARE * len(times):
            ordered = sorted(times) if not self.bad else [t for t in times if 0.0 < t < math.inf]
            if self.bad:
                ordered.sort()
        else:
            for t in added:  # first: a time dropped may be one added since
                bisect.insort(ordered, t)
            for t in dropped:
                del ordered[bisect.bisect_left(ordered, t)]
        self._ordered = ordered
        added.clear()
        dropped.clear()
        return ordered

    def clear(self) -> None:
        self.samples.clear()
        self.times.clear()
        self.bad = self._changes = 0
        self._ordered = []
        self._added.clear()
        self._dropped.clear()
        self.version += 1

    def __len__(self) -> int:
        return len(self.samples)

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


__all__ = ["History", "Step"]
