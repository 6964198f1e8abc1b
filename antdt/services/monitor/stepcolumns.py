"""One step of many ranks as columns, for `JobDetector.ingest_step`. Pure, no I/O: the
numeric columns are any sequences or numpy arrays.

A step whose rows are all acceptable is screened in bulk, over its columns as arrays;
any doubt (a value out of range, a column not all numbers) and the detector screens row
by row, exactly as `ingest_fields` would."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import compress, repeat
from operator import is_not
from typing import Any, Final, NamedTuple

import numpy as np
import numpy.typing as npt

from antdt.services.monitor.latest import LatestSteps, nans_for_nones, nones_for_nans
from antdt.services.monitor.onepiece import acceptable_one_piece

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
IntColumn = Sequence[int] | Ints
FloatColumn = Sequence[float] | Floats

#: The wire contract's largest duration, seconds: a row past it is refused.
MAX_S = 1e7
#: The most samples (or planned batch) a rank's step may count: the wire contract bounds
#: none, the detector keeps them in int64 blocks and float64 sums (exact to 2**53).
MAX_SAMPLES = 2**40
#: The highest step a rank's event may name: the wire bounds none, the detector reads the
#: ranks' latest steps as int64.
MAX_STEP = 2**62


class StepFields(NamedTuple):
    """Every field of a StepEvent ingest reads, in this order (samples to step_s are a
    Row), read with one C call per event. A caller with rows of figures, not events,
    passes them to `ingest_fields` as plain tuples (the link's round trip optional), or
    a step of many ranks to `ingest_step` as columns."""

    job: str
    rank: int
    host: str
    step: int
    plan_version: int
    local_batch: int
    started_at: float
    ended_at: float
    samples: int
    compute_s: float
    data_wait_s: float
    comm_s: float
    step_s: float
    link_rtt_s: float | None = None
    helped: Mapping[int, int] | None = None
    one_piece_s: float | None = None


#: A StepEvent's `vars()` to its StepFields, one C call.
fields_of: Callable[[dict[str, Any]], StepFields] = operator.itemgetter(*StepFields._fields)
#: Where in StepFields: the five fields of a Row, the link's round trip, `helped`.
ROW_FIELDS = slice(8, 13)
LINK_RTT: Final = 13
HELPED: Final = 14


class StepColumns(NamedTuple):
    """StepEvent fields of one step, one column per field and one row per event (the
    job's, as the events name it); rows are ingested in order. A numeric column is any
    sequence or a numpy array (a simulator's: screened and accounted with no copy into
    Python objects). `link_rtt_s` and `one_piece_s`: None when no event carries one;
    as a sequence, a row's None where it has none, as an array NaN."""

    job: str
    rank: IntColumn
    host: Sequence[str]
    step: IntColumn
    plan_version: IntColumn
    local_batch: IntColumn
    started_at: FloatColumn
    ended_at: FloatColumn
    samples: IntColumn
    compute_s: FloatColumn
    data_wait_s: FloatColumn
    comm_s: FloatColumn
    step_s: FloatColumn
    link_rtt_s: Sequence[float | None] | Floats | None = None
    one_piece_s: Sequence[float | None] | Floats | None = None

    def rows(self) -> Iterator[tuple[object, ...]]:
        """Each row as the tuple `ingest_fields` takes (StepFields order; no `helped`),
        of Python numbers."""
        figures = [listed(column) for column in self[1:13]]
        if self.one_piece_s is not None:
            link = repeat(None) if self.link_rtt_s is None else nones_for_nans(self.link_rtt_s)
            pieces = nones_for_nans(self.one_piece_s)
            return zip(repeat(self.job), *figures, link, repeat(None), pieces)  # type: ignore[call-overload, no-any-return]
        if self.link_rtt_s is not None:
            return zip(repeat(self.job), *figures, nones_for_nans(self.link_rtt_s))  # type: ignore[call-overload, no-any-return]
        return zip(repeat(self.job), *figures)  # type: ignore[call-overload, no-any-return]


class StepArrays(NamedTuple):
    """A step's numeric columns as arrays (`arrays_of`): ints where StepFields has ints."""

    rank: Ints
    step: Ints
    plan_version: Ints
    local_batch: Ints
    started_at: Floats
    ended_at: Floats
    samples: Ints
    compute_s: Floats
    data_wait_s: Floats
    comm_s: Floats
    step_s: Floats


_INTS = ("rank", "step", "plan_version", "local_batch", "samples")


def arrays_of(columns: StepColumns) -> StepArrays | None:
    """The step's numeric columns as arrays; None when some column is not all numbers
    (or not all ints where ints are): such a step is screened row by row."""
    found: list[Any] = []
    for name in StepArrays._fields:
        try:
            column = np.asarray(getattr(columns, name))
        except (TypeError, ValueError):  # ragged, say
            return None
        kinds = "iu" if name in _INTS else "fiu"
        if column.ndim != 1 or column.dtype.kind not in kinds:
            return None
        found.append(column.astype(np.int64 if name in _INTS else np.float64, copy=False))
    return StepArrays(*found)


def unequal_columns(columns: StepColumns) -> list[str]:
    """The columns (of those given) whose length is not the ranks': a caller's error."""
    n = len(columns.rank)
    named = zip(StepColumns._fields[2:], columns[2:], strict=True)
    return [name for name, column in named if column is not None and len(column) != n]


def listed(column: Any) -> Any:
    """A column's values as Python numbers."""
    return column.tolist() if isinstance(column, np.ndarray) else column  # type: ignore[no-any-return]


def _in_range(figures: Sequence[float]) -> bool:
    """Every figure (a non-empty column) in [0, MAX_S]: none NaN, none infinite."""
    total = sum(figures)
    return total == total and min(figures) >= 0.0 and max(figures) <= MAX_S


def _acceptable_optional(pieces: Sequence[float | None] | Floats) -> bool:
    """Every value of an optional column (one-piece times, round trips)
    `acceptable_one_piece`: the given ones floats (or ints) in range, checked at C
    speed; any other type, one by one. An array's: floats or ints, NaN for none."""
    if isinstance(pieces, np.ndarray):
        if pieces.ndim != 1 or pieces.dtype.kind not in "fiu":
            return False
        given = pieces[pieces == pieces]
        return bool(((given >= 0.0) & (given <= MAX_S)).all())
    given = list(compress(pieces, map(is_not, pieces, repeat(None))))
    if not given:
        return True
    if set(map(type, given)) <= _NUMBERS:
        return _in_range(given)  # type: ignore[arg-type]
    return all(acceptable_one_piece(v, MAX_S) for v in given)


_NUMBERS = frozenset((float, int))


def all_acceptable(columns: StepColumns, arrays: StepArrays, latest: LatestSteps, job: str) -> bool:
    """True only when `ingest_fields` would reject none of the rows (False: maybe some):
    one job, distinct ranks of the job, finite durations in range, times in order and
    after each rank's last step (`latest`, the job's). `arrays`: the columns' (`arrays_of`)."""
    a, n = arrays, len(arrays.rank)
    if columns.job != job or n == 0:
        return columns.job == job
    if any(len(column) != n for column in a) or a.rank.min() < 0 or a.rank.max() >= len(latest):
        return False
    if np.bincount(a.rank, minlength=len(latest)).max() > 1 or len(columns.host) != n:
        return False
    if a.samples.min() < 0 or a.started_at.min() < 0.0 or not np.isfinite(a.ended_at).all():
        return False
    if a.samples.max() > MAX_SAMPLES or a.local_batch.min() < 0:
        return False
    if a.local_batch.max() > MAX_SAMPLES or a.step.max() > MAX_STEP:
        return False
    if not (a.started_at <= a.ended_at).all():  # False on a NaN too
        return False
    for figures in (a.compute_s, a.data_wait_s, a.comm_s, a.step_s):
        if not ((figures >= 0.0) & (figures <= MAX_S)).all():
            return False
    for optional in (columns.link_rtt_s, columns.one_piece_s):
        if optional is not None and not _acceptable_optional(optional):
            return False
    last_steps = latest.step[a.rank]
    if not (a.step > last_steps).all():
        return False
    last_ended = latest.ended_at[a.rank]
    return bool(((a.ended_at >= last_ended) | (last_steps < 0)).all())


__all__ = [
    "MAX_S",
    "MAX_SAMPLES",
    "MAX_STEP",
    "StepArrays",
    "StepColumns",
    "StepFields",
    "all_acceptable",
    "arrays_of",
    "listed",
    "nans_for_nones",
    "nones_for_nans",
    "unequal_columns",
]
