"""The incidents a job's previous owner left open (read on ANTDT_INCIDENTS), each with
the span its earliest transition was published under: the monitor replica taking the
job on carries them on (`JobDetector.adopt`) in their traces, the controller replica
decides knowing them. At most READ_LIMIT of a job's incidents are read: past that, from
a later start (LOOKBACKS_S). A read that is not whole (past READ_LIMIT even from the
latest start, or cut short) raises: its newest transitions, those that resolve, may be
the ones missing, and a resolved incident taken for open would be carried on."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from opentelemetry.trace import SpanContext

from antdt.runtime.bus import Bus, BusError
from antdt.schemas import INCIDENT_STREAM, Incident, IncidentState, Subjects

#: Incident messages of one job read at most, per attempt.
READ_LIMIT = 20_000
#: Start times tried in turn (seconds before now) while a job has more than READ_LIMIT.
LOOKBACKS_S = (None, 86_400.0, 3_600.0, 600.0)


def still_open(records: Iterable[Incident]) -> list[Incident]:
    """Each incident's latest transition among `records` (oldest first), those not
    resolved, in the order they opened. Pure."""
    latest: dict[str, Incident] = {}
    for incident in records:
        latest[incident.id] = incident
    open_ = [i for i in latest.values() if i.state is not IncidentState.RESOLVED]
    return sorted(open_, key=lambda i: i.opened_at)


class LeftOpen(NamedTuple):
    incident: Incident  # its latest transition
    trace: SpanContext | None  # the span its earliest transition read was published under


async def open_incidents(bus: Bus, subjects: Subjects, job: str, now: float) -> list[LeftOpen]:
    """The job's incidents left open on ANTDT_INCIDENTS (raises when it cannot read them
    all: BusError)."""
    replay, _ = await bus.jetstream.read_recent(
        INCIDENT_STREAM,
        subjects.incident(job),
        Incident,
        limit=READ_LIMIT,
        lookbacks_s=LOOKBACKS_S,
        now=now,
    )
    if replay.truncated:
        raise BusError(
            f"job {job}'s incidents not read whole: {len(replay.items) + replay.rejected} "
            f"of {replay.available}"
        )
    ours = [(i, t) for i, t in zip(replay.items, replay.traces, strict=True) if i.job == job]
    first_trace: dict[str, SpanContext | None] = {}
    for incident, trace in ours:
        first_trace.setdefault(incident.id, trace)
    return [LeftOpen(i, first_trace[i.id]) for i in still_open(i for i, _ in ours)]
