"""Window statistics for the detector: robust per-rank summaries and a sorted multiset.

Pure helpers, no I/O. A rank's window is W consecutive step events. Its health figures
are medians of each per-step figure, so a single slow step (GC pause, page fault) cannot
make a rank look slow; its level, the figure the rank is judged by, is a low quantile of
its step costs (docs/detection.md).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from itertools import repeat
from math import copysign
from operator import add, is_not, sub, truediv
from typing import Any, NamedTuple, TypeVar, cast

import numpy as np
import numpy.typing as npt

from antdt.services.monitor.reference import ReferenceConfig
from antdt.services.monitor.speed import quantile_sorted

#: What a window keeps of each step event: (samples, compute_s, data_wait_s, comm_s,
#: step_s). Not the event itself: a fraction of the memory per tracked rank, and cheaper
#: to read back when the window closes.
Row = tuple[int, float, float, float, float]


T = TypeVar("T", bound=tuple[Any, ...])


def made_of(cls: type[T], *columns: Iterable[Any]) -> Iterator[T]:
    """`cls(*row)` of each row of `columns` (of one length), for a NamedTuple `cls`:
    `cls._make` without its Python frame. A close builds a WindowStats
    and a Judgement per rank."""
    return map(tuple.__new__, repeat(cls), zip(*columns, strict=True))  # type: ignore[arg-type]


class WindowStats(NamedTuple):
    """One closed window of one rank (seconds, shares in [0, 1]), summarized at its
    close: what the Judge compares, and the medians the health and the stall limit read.
    A NamedTuple: immutable, and cheaper to build than a dataclass; it keeps no step of
    its window (a job's close frees them all at once). A step's cost is its compute time
    per sample plus the job's fixed part: compute_s / (samples + fixed)."""

    compute_per_sample: float  # median compute_s / samples: the health figures' speed
    busy_per_sample: float  # (compute_s + data_wait_s) / samples: time before the barrier
    data_share: float  # data_wait_s / step_s
    comm_share: float  # comm_s / step_s (gradient exchange incl. barrier wait)
    level: float  # the rank's recent best: a low quantile of its costs, this window and
    # the one before (the Judge's figure: the job's reference is made of them)
    window_level: float  # the same over this window alone: over the reference, its ratio
    cost: float  # the median cost of this window: a rank this much slower is slow at once
    events: int  # the window's steps
    step_s: float  # median step time
    samples: float  # median samples per step (an int when the window's length is odd)
    comm_s: float  # median comm_s
    overhead_s: float  # median step_s - compute_s - comm_s: data wait plus the unclaimed

    @property
    def samples_per_s(self) -> float:
        """Compute throughput: samples per second of forward+backward."""
        return 1.0 / self.compute_per_sample


def step_figures(rows: Sequence[Row]) -> tuple[float, float, float, float]:
    """A window's median step time, samples, comm time and overhead (step_s - compute_s -
    comm_s, at least 0; `x if x > 0.0 else 0.0` keeps a NaN), over its rows' columns."""
    samples, compute, _, comm, steps = map(list, zip(*rows, strict=True))
    overhead = [x if x > 0.0 else 0.0 for x in map(sub, map(sub, steps, compute), comm)]
    return _median(steps), _median(samples), _median(comm), _median(overhead)


def summarize(
    rows: Sequence[Row],
    previous: Sequence[float],
    fixed_samples: float,
    config: ReferenceConfig,
) -> WindowStats | None:
    """`summarized`'s statistics alone."""
    found = summarized(rows, previous, fixed_samples, config)
    return None if found is None else found[0]


def summarized(
    rows: Sequence[Row],
    previous: Sequence[float],
    fixed_samples: float,
    config: ReferenceConfig,
) -> tuple[WindowStats, list[float]] | None:
    """The window's statistics and its steps' costs ascending (the next window's
    `previous`), or None when no step carried a measurable compute time.
    Steps without samples (or compute time) count for step and comm figures only.
    `previous`: the costs of the rank's window before (at the same batch), ascending,
    for its level. One pass, one sort per figure, no calls in the loop: it runs on the
    ingest path."""
    columns = tuple(zip(*rows, strict=True))
    if columns and _all_measured(*columns):  # the common window
        return _summarize_measured(rows, columns, previous, fixed_samples, config)
    compute, busy, data_share, comm_share = [], [], [], []
    for n, c, d, m, s in rows:
        if n > 0 and c > 0:
            compute.append(c / n)
            busy.append((c + d) / n)
        # Parts may exceed step_s by the 5% the wire contract tolerates: clamp into [0, 1]
        # (conditionals, not min(): a builtin call per figure shows on this path).
        d_share, m_share = (d / s, m / s) if s > 0 else (0.0, 0.0)
        data_share.append(d_share if d_share < 1.0 else 1.0)
        comm_share.append(m_share if m_share < 1.0 else 1.0)
    if not compute:
        return None
    compute_per_sample = _median(compute)  # sorted now: the costs, with no fixed part
    costs = compute
    if fixed_samples:
        costs = sorted(c / (n + fixed_samples) for n, c, _, _, _ in rows if n > 0 and c > 0)
    parts = (busy, data_share, comm_share)
    return _stats(rows, compute_per_sample, costs is compute, costs, parts, previous, config)


def _all_measured(samples: Sequence[int], times: Sequence[float], *rest: Sequence[float]) -> bool:
    """Every step has samples, compute time and step time above 0, none NaN."""
    steps = rest[-1]
    total = sum(samples) + sum(times) + sum(steps)
    return total == total and min(samples) > 0 and min(times) > 0 and min(steps) > 0


def _summarize_measured(
    rows: Sequence[Row],
    columns: tuple[Sequence[Any], ...],
    previous: Sequence[float],
    fixed_samples: float,
    config: ReferenceConfig,
) -> tuple[WindowStats, list[float]]:
    """`summarized` of a window whose every step has samples, compute and step time
    (> 0), from its `columns`: the same floats, divided at C speed (`map`), no branch
    per step (shares over 1 clamped as there)."""
    samples, times, data, comm, steps = columns
    compute = list(map(truediv, times, samples))
    busy = list(map(truediv, map(add, times, data), samples))
    data_share = [x if x < 1.0 else 1.0 for x in map(truediv, data, steps)]
    comm_share = [x if x < 1.0 else 1.0 for x in map(truediv, comm, steps)]
    compute_per_sample = _median(compute)  # sorted now: the costs, with no fixed part
    costs = compute
    if fixed_samples:
        costs = sorted(map(truediv, times, map(add, samples, repeat(fixed_samples))))
    parts = (busy, data_share, comm_share)
    return _stats(rows, compute_per_sample, costs is compute, costs, parts, previous, config)


def _stats(
    rows: Sequence[Row],
    compute_per_sample: float,
    unfixed: bool,
    costs: list[float],
    parts: tuple[list[float], list[float], list[float]],
    previous: Sequence[float],
    config: ReferenceConfig,
) -> tuple[WindowStats, list[float]]:
    """A window's statistics from its figures, and its `costs` ascending (the compute per
    sample itself when `unfixed`: no fixed part), the busy, data and comm figures per
    step."""
    busy, data_share, comm_share = parts
    q = config.level_quantile
    figures = step_figures(rows)
    stats = WindowStats(
        compute_per_sample=compute_per_sample,
        busy_per_sample=_median(busy),
        data_share=_median(data_share),
        comm_share=_median(comm_share),
        level=quantile_sorted(sorted([*previous, *costs]) if previous else costs, q),
        window_level=quantile_sorted(costs, q),
        cost=compute_per_sample if unfixed else _median(costs),
        events=len(rows),
        step_s=figures[0],
        samples=figures[1],
        comm_s=figures[2],
        overhead_s=figures[3],
    )
    return stats, costs


def _median(values: list[float] | list[int]) -> float:
    values.sort()
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2.0


_given = partial(is_not, None)

#: A value moving this many places or fewer is shifted into place (else: two memmoves).
_NEAR = 32


class SortedValues:
    """A sorted multiset of floats, one value per rank.

    Replacing a value costs O(log n) to find plus a memmove; medians are O(1). This keeps
    ingest cheap for jobs with thousands of ranks, where re-sorting every rank's latest
    median at every window close would be quadratic.
    """

    __slots__ = ("_signed_zero", "_values")

    def __init__(self) -> None:
        self._values: list[float] = []
        self._signed_zero = False  # a -0.0 was ever put in (0.0 == -0.0: not the same)

    def __len__(self) -> int:
        return len(self._values)

    def replace(self, old: float | None, new: float | None) -> None:
        """Swap one copy of `old` (None: nothing to remove) for `new` (None: nothing).
        A short move shifts only the values between the two places (a rank's figure
        moves little from one window to the next), not half the list twice: the same
        list as a removal and an insertion, at a fraction of the cost at 10,000 ranks."""
        values = self._values
        if new == 0.0 and copysign(1.0, new) < 0.0:  # type: ignore[arg-type]  # None != 0
            self._signed_zero = True
        if old is not None and old == new and (old != 0.0 or not self._signed_zero):
            return  # the same float, nothing moves (at 10,000 ranks, a copy of 10,000)
        at = to = 0
        if old is not None and new is not None:
            at = bisect.bisect_left(values, old)
            to = bisect.bisect_right(values, new)  # where insort puts it, `old` still in
        if old is None or new is None or abs(to - at) > _NEAR:
            if old is not None:
                del values[bisect.bisect_left(values, old, lo=at)]
            if new is not None:
                bisect.insort(values, new)
            return
        if to <= at:
            values[to + 1 : at + 1] = values[to:at]
        else:
            to -= 1  # `old` left from before it
            values[at:to] = values[at + 1 : to + 1]
        values[to] = new

    def reset(self, values: Iterable[float | None]) -> None:
        """The multiset becomes `values` (None: none), sorted afresh."""
        self._values = sorted(cast(Iterable[float], filter(_given, values)))
        self._signed_zero = self._signed_zero or 0.0 in self._values  # -0.0 == 0.0

    def reset_array(self, values: npt.NDArray[np.float64]) -> None:
        """`reset` of the values of an array (NaN: none), sorted by numpy: a stable sort
        of the same floats (-0.0 equal to 0.0, as `sorted` has it)."""
        self._values = np.sort(values[values == values], kind="stable").tolist()
        self._signed_zero = self._signed_zero or 0.0 in self._values

    def median(self) -> float | None:
        return _median_of_sorted(len(self._values), self._values.__getitem__)

    def median_without(self, value: float) -> float | None:
        """Median of the multiset minus one copy of `value` (which must be present).

        This is "the median of the other ranks": with two ranks the slow one is compared
        with the other one, not hidden inside a median of two.
        """
        values = self._values
        n = len(values) - 1
        if n <= 0:
            return None
        skip = bisect.bisect_left(values, value)
        # Index j of the list without `value` is values[j] before `skip`, values[j+1] after.
        mid = n // 2
        upper = values[mid + (mid >= skip)]
        if n % 2:
            return upper
        lower = values[mid - 1 + (mid - 1 >= skip)]
        return (lower + upper) / 2.0

    def medians_without(self, held: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """`median_without(v)` of each `v` of `held` (NaN: `median()`), NaN where there is
        none: the same floats, over arrays."""
        values = np.asarray(self._values, dtype=np.float64)
        given = held == held
        found = np.full(len(held), np.nan)
        whole = self.median()
        if whole is not None:
            found[~given] = whole
        n = len(values) - 1
        if n > 0 and given.any():
            skip = np.searchsorted(values, held[given], side="left")
            mid = n // 2
            upper = values[mid + (mid >= skip)]
            if n % 2:
                found[given] = upper
            else:
                found[given] = (values[mid - 1 + (mid - 1 >= skip)] + upper) / 2.0
        return found

    def max(self) -> float | None:
        return self._values[-1] if self._values else None

    @property
    def values(self) -> Sequence[float]:
        """The values, ascending (read only: a view, not a copy)."""
        return self._values


def _median_of_sorted(n: int, at: Callable[[int], float]) -> float | None:
    """Median of n sorted values read through `at(index)`."""
    if n <= 0:
        return None
    mid = n // 2
    if n % 2:
        return at(mid)
    return (at(mid - 1) + at(mid)) / 2.0
