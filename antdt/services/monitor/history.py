"""A rank's recent steps at one speed, as its speed model reads them. Pure, no clock.

Kept as two columns (batch sizes, compute times), not one tuple per step: an append
costs two deque appends on the ingest path. What a fit reads besides is kept cheaply:
whether one batch size runs through it (a count of changes of size) and its measurable
times in order, brought up to date at the fit from the few steps added and dropped
since the last (a health fits every rank, each history changed by a step or a few: an
insertion per step, not a sort of up to 96 times per rank and health)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Iterator, Sequence
from operator import attrgetter, ne
from typing import overload

Step = tuple[int, float]  # (samples, compute_s)

#: Times added and dropped since the last read of `ordered`, per time it holds, beyond
#: which it is sorted afresh (an insertion and a removal cost about a tenth of a sort of
#: 96 times, a sort of 16 about a third as much).
_RESORT_SHARE = 0.25


class History(Sequence[Step]):
    """The last `maxlen` (samples, compute_s) steps, oldest first, read as a sequence of
    such pairs; `version` changes with every change (a fit of an unchanged history is
    kept). `bad`: how many times are not measurable (not in (0, inf)).

    A step added waits in two short lists and joins the columns at the next read, with
    the steps added since, in a few C calls: the ingest path pays two list appends a
    step (`add_each`: at C speed for a step of many ranks), the few readers (a health,
    a round of windows, a rank turning slow) the rest."""

    __slots__ = (
        *("_added", "_changes", "_dropped", "_entered", "_new_samples", "_new_times"),
        *("_ordered", "_samples", "_times", "_version", "bad", "epoch"),
    )

    def __init__(self, maxlen: int) -> None:
        self._samples: deque[int] = deque(maxlen=maxlen)
        self._times: deque[float] = deque(maxlen=maxlen)
        self._new_samples: list[int] = []  # steps added since the last read ...
        self._new_times: list[float] = []  # ... not yet in the columns
        self.bad = 0
        self._version = 0
        self.epoch = 0  # restarts: cleared, or all but its latest steps dropped at once
        self._entered = 0  # steps that joined the columns over its life: where a step lies
        self._changes = 0  # steps whose batch size differs from the step's before
        self._ordered: list[float] | None = []  # None: to be sorted afresh
        self._added: list[float] = []  # measurable times added since `_ordered` ...
        self._dropped: list[float] = []  # ... and dropped

    def add(self, samples: int, compute_s: float) -> None:
        """One step more (the oldest leaves when full)."""
        new = self._new_times
        new.append(compute_s)
        self._new_samples.append(samples)
        if len(new) >= PENDING_STEPS:
            self._settle()

    @staticmethod
    def add_each(
        histories: Sequence[History], samples: Sequence[int], times: Sequence[float]
    ) -> None:
        """`histories[i].add(samples[i], times[i])` for every i, at C speed."""
        new_samples, new_times = list(map(_new_samples, histories)), map(_new_times, histories)
        deque(map(list.append, new_samples, samples), maxlen=0)
        deque(map(list.append, new_times, times), maxlen=0)
        if max(map(len, new_samples), default=0) >= PENDING_STEPS:
            for history in histories:
                if len(history._new_times) >= PENDING_STEPS:
                    history._settle()

    def append(self, step: Step) -> None:
        self.add(*step)

    @property
    def version(self) -> int:
        """Changes with every change: a step added, dropped, or the history cleared."""
        return self._version + len(self._new_times)

    @property
    def samples(self) -> deque[int]:
        """The steps' batch sizes, oldest first (read only)."""
        self._settle()
        return self._samples

    @property
    def times(self) -> deque[float]:
        """The steps' compute times, oldest first (read only)."""
        self._settle()
        return self._times

    def popleft(self) -> Step:
        self._settle()
        self._version += 1
        samples, compute_s = self._samples.popleft(), self._times.popleft()
        if self._samples and self._samples[0] != samples:
            self._changes -= 1
        self._left([compute_s])
        return samples, compute_s

    def keep_latest(self, count: int) -> None:
        """All but the latest `count` steps leave, as `popleft` one by one would."""
        self._settle()
        samples, times = self._samples, self._times
        drop = len(samples) - max(0, count)
        if drop <= 0:
            return
        if self._changes:
            head = list(itertools.islice(samples, drop + 1))
            self._changes -= sum(map(ne, head[1:], head))
        leaving = list(itertools.islice(times, drop))
        kept_samples = list(itertools.islice(samples, drop, None))
        kept_times = list(itertools.islice(times, drop, None))
        samples.clear()
        times.clear()
        samples.extend(kept_samples)
        times.extend(kept_times)
        self._version += drop
        self.epoch += 1
        self._left(leaving)

    def _settle(self) -> None:
        """The steps added since the last read into the columns: the oldest leave as
        they would one by one, the counts of changes and bad times follow."""
        new_times = self._new_times
        if not new_times:
            return
        new_samples, samples, times = self._new_samples, self._samples, self._times
        held = len(samples)
        drop = max(0, held + len(new_times) - times.maxlen)  # type: ignore[operator]
        # a step's batch against the one before it: the new ones', the leaving ones'
        first = new_samples[0]
        if new_samples.count(first) != len(new_samples):
            self._changes += sum(map(ne, new_samples[1:], new_samples))
        if held and samples[-1] != first:
            self._changes += 1
        if drop and self._changes:
            steps = [*itertools.islice(samples, min(drop + 1, held)), *new_samples]
            self._changes -= sum(map(ne, steps[1 : drop + 1], steps[:drop]))
        leaving = [*itertools.islice(times, min(drop, held)), *new_times[: max(0, drop - held)]]
        self._version += len(new_times)
        self._entered += len(new_times)
        samples.extend(new_samples)
        times.extend(new_times)
        self._joined(new_times)
        self._left(leaving)
        new_samples.clear()
        new_times.clear()

    def _joined(self, joined: list[float]) -> None:
        """`joined` times came in: the measurable wait to be put in order (or, when more
        came than the history holds, it is sorted afresh when read)."""
        if _all_measurable(joined):
            good = joined
        else:
            good = [t for t in joined if 0.0 < t < math.inf]
            self.bad += len(joined) - len(good)
        added = self._added
        if self._ordered is not None and len(added) + len(good) <= len(self._times):
            added.extend(good)
        else:  # not read for a while: sorted afresh when read
            self._ordered = None
            added.clear()
            self._dropped.clear()

    def _left(self, left: list[float]) -> None:
        """The oldest times `left` left the history."""
        if not left:
            return
        good = left if _all_measurable(left) else [t for t in left if 0.0 < t < math.inf]
        self.bad -= len(left) - len(good)
        if self._ordered is not None:
            self._dropped.extend(good)

    def first_and_latest(self) -> tuple[int, int] | None:
        """The batch sizes of its oldest and its latest step (None: it has none), read
        without bringing the steps added since the last read in."""
        held, new = self._samples, self._new_samples
        total = len(held) + len(new)
        if not total:
            return None
        drop = max(0, total - held.maxlen)  # type: ignore[operator]  # never None
        first = held[drop] if drop < len(held) else new[drop - len(held)]
        return first, new[-1] if new else held[-1]

    def last_change_span(self, steps: int) -> tuple[int, int, int] | None:
        """Up to `steps` steps on either side of its latest change of batch size, as
        (epoch, first, end): steps first..end - 1 of those that ever joined it. The same
        span holds the same steps. None: one batch size throughout."""
        if not self.changes:
            return None
        samples = self._samples
        differs = list(map(ne, itertools.islice(samples, 1, None), samples))
        change = len(differs) - differs[::-1].index(True)  # the step whose size is new
        first = self._entered - len(samples)
        return self.epoch, first + max(0, change - steps), first + min(len(samples), change + steps)

    def steps_between(self, first: int, end: int) -> list[Step]:
        """Its steps first..end - 1 of those that ever joined it (`last_change_span`)."""
        self._settle()
        held = self._entered - len(self._samples)  # steps that left before the first held
        start, stop = max(0, first - held), max(0, end - held)
        samples = itertools.islice(self._samples, start, stop)
        return list(zip(samples, itertools.islice(self._times, start, stop), strict=True))

    @property
    def changes(self) -> int:
        """Steps whose batch size differs from the step's before (0: one size throughout)."""
        self._settle()
        return self._changes

    def one_batch(self) -> int | None:
        """The batch size of every step, when all are measurable at one size (> 0) and
        there is at least one; None otherwise."""
        self._settle()
        if self._changes or self.bad or not self._samples:
            return None
        batch = self._samples[0]
        return batch if batch > 0 else None

    @property
    def ordered(self) -> list[float]:
        """The measurable times, ascending (read only)."""
        self._settle()
        ordered, added, dropped, times = self._ordered, self._added, self._dropped, self._times
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
        self._version = self.version + 1
        self.epoch += 1
        self._new_samples.clear()
        self._new_times.clear()
        self._samples.clear()
        self._times.clear()
        self.bad = self._changes = 0
        self._ordered = []
        self._added.clear()
        self._dropped.clear()

    def __len__(self) -> int:
        self._settle()
        return len(self._samples)

    def __iter__(self) -> Iterator[Step]:
        self._settle()
        return zip(self._samples, self._times, strict=True)

    @overload
    def __getitem__(self, index: int) -> Step: ...

    @overload
    def __getitem__(self, index: slice) -> list[Step]: ...

    def __getitem__(self, index: int | slice) -> Step | list[Step]:
        if isinstance(index, slice):
            return list(self)[index]
        self._settle()
        return self._samples[index], self._times[index]

    def __repr__(self) -> str:
        return f"History({list(self)!r})"


#: Steps added and not read, at most: a history nobody reads keeps no backlog.
PENDING_STEPS = 32
_new_samples, _new_times = attrgetter("_new_samples"), attrgetter("_new_times")


def _all_measurable(times: list[float]) -> bool:
    """Every time in (0, inf); the sum is finite only when none is infinite or NaN."""
    return min(times) > 0.0 and math.isfinite(sum(times))


__all__ = ["History", "Step"]
