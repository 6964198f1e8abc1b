"""A rank's recent steps at one speed, as its speed model reads them. Pure, no clock.

Kept as two columns (batch sizes, compute times), not one tuple per step: a fit reads
them with a few C calls (is the batch the same throughout, the quantile of the times),
and an append costs two deque appends on the ingest path."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import overload

Step = tuple[int, float]  # (samples, compute_s)


class History(Sequence[Step]):
    """The last `maxlen` (samples, compute_s) steps, oldest first, read as a sequence of
    such pairs; `version` changes with every change (a fit of an unchanged history is
    kept)."""

    __slots__ = ("samples", "times", "version")

    def __init__(self, maxlen: int) -> None:
        self.samples: deque[int] = deque(maxlen=maxlen)
        self.times: deque[float] = deque(maxlen=maxlen)
        self.version = 0

    def add(self, samples: int, compute_s: float) -> None:
        """One step more (the oldest leaves when full)."""
        self.samples.append(samples)
        self.times.append(compute_s)
        self.version += 1

    def append(self, step: Step) -> None:
        self.add(*step)

    def popleft(self) -> Step:
        self.version += 1
        return self.samples.popleft(), self.times.popleft()

    def clear(self) -> None:
        self.samples.clear()
        self.times.clear()
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
