"""One step of many ranks as columns, for `JobDetector.ingest_step`. Pure, no numpy:
the columns are any sequences (lists, or numpy arrays turned to lists by the caller).

A step whose rows are all acceptable is screened in bulk, with builtins that run at C
speed over whole columns; any doubt and the detector screens row by row, exactly as
`ingest_fields` would."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import compress, repeat
from operator import attrgetter, ge, gt, is_not, le
from typing import Any, Final, NamedTuple

from antdt.services.monitor.onepiece import acceptable_one_piece
from antdt.services.monitor.ranks import RankMemory

#: The wire contract's largest duration, seconds: a row past it is refused.
MAX_S = 1e7
_last_step = attrgetter("last_step")
_last_ended_at = attrgetter("last_ended_at")


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
    """StepEvent fields of one step, one sequence per field and one row per event (the
    job's, as the events name it); rows are ingested in order. `link_rtt_s`: None when
    no event carries a round trip."""

    job: str
    rank: Sequence[int]
    host: Sequence[str]
    step: Sequence[int]
    plan_version: Sequence[int]
    local_batch: Sequence[int]
    started_at: Sequence[float]
    ended_at: Sequence[float]
    samples: Sequence[int]
    compute_s: Sequence[float]
    data_wait_s: Sequence[float]
    comm_s: Sequence[float]
    step_s: Sequence[float]
    link_rtt_s: Sequence[float | None] | None = None
    one_piece_s: Sequence[float | None] | None = None

    def rows(self) -> Iterator[tuple[object, ...]]:
        """Each row as the tuple `ingest_fields` takes (StepFields order; no `helped`)."""
        figures = self[1:13]
        if self.one_piece_s is not None:
            link = repeat(None) if self.link_rtt_s is None else self.link_rtt_s
            return zip(repeat(self.job), *figures, link, repeat(None), self.one_piece_s)  # type: ignore[call-overload, no-any-return]
        if self.link_rtt_s is not None:
            return zip(repeat(self.job), *figures, self.link_rtt_s)  # type: ignore[call-overload, no-any-return]
        return zip(repeat(self.job), *figures)  # type: ignore[call-overload, no-any-return]


def _in_range(figures: Sequence[float]) -> bool:
    """Every figure (a non-empty column) in [0, MAX_S]: none NaN, none infinite."""
    total = sum(figures)
    return total == total and min(figures) >= 0.0 and max(figures) <= MAX_S


def _acceptable_pieces(pieces: Sequence[float | None]) -> bool:
    """Every one-piece time `acceptable_one_piece`: the given ones floats (or ints) in
    range, checked at C speed; any other type, one by one."""
    given = list(compress(pieces, map(is_not, pieces, repeat(None))))
    if not given:
        return True
    if set(map(type, given)) <= _NUMBERS:
        return _in_range(given)  # type: ignore[arg-type]
    return all(acceptable_one_piece(v, MAX_S) for v in given)


_NUMBERS = frozenset((float, int))


def all_acceptable(columns: StepColumns, ranks: Sequence[RankMemory], job: str) -> bool:
    """True only when `ingest_fields` would reject none of the rows (False: maybe some):
    one job, distinct ranks of the job, finite durations in range, times in order and
    after each rank's last step."""
    c = columns
    n = len(c.rank)
    if c.job != job or n == 0:
        return c.job == job
    if min(c.rank) < 0 or max(c.rank) >= len(ranks) or len(set(c.rank)) != n:
        return False
    if min(c.samples) < 0 or min(c.started_at) < 0.0 or not math.isfinite(max(c.ended_at)):
        return False
    if not all(map(le, c.started_at, c.ended_at)):  # False on a NaN too
        return False
    for figures in (c.compute_s, c.data_wait_s, c.comm_s, c.step_s):
        if not _in_range(figures):
            return False
    if c.one_piece_s is not None and not _acceptable_pieces(c.one_piece_s):
        return False
    memories = [ranks[r] for r in c.rank]
    last_steps = list(map(_last_step, memories))
    if not all(map(gt, c.step, last_steps)):
        return False
    if min(last_steps) >= 0:  # every rank stepped before: its time may not run back
        return all(map(ge, c.ended_at, map(_last_ended_at, memories)))
    return all(
        ended >= last_ended or last_step < 0
        for ended, last_ended, last_step in zip(
            c.ended_at, map(_last_ended_at, memories), map(_last_step, memories), strict=True
        )
    )


__all__ = ["StepColumns", "StepFields", "all_acceptable"]
