"""The incidents a job's previous owner left open, for the replica that takes it over.

A monitor replica that dies (or loses its lease) leaves its jobs' open incidents open:
nobody else would ever resolve them, so the controller and custom policies kept acting
on a straggler that had long recovered, and `antdt status` showed it forever. Every
incident transition is on ANTDT_INCIDENTS, so the new owner reads the job's incidents
there when it takes the job on, and its detector carries on those still open
(`JobDetector.adopt`): same id, resolved by the same rules.

A job's incidents are read oldest first, at most READ_LIMIT of them. A job with more
retained than that (a long run, many transient stragglers) is read from a later start
time, in LOOKBACKS_S steps, so that the newest are the ones read: an incident opened
before that start and still open is then not carried on (logged).

Each incident left open comes with the span its earliest transition read was published
under (its traceparent on the stream: the OPENED one's is the incident's root), so that
its later transitions join its trace rather than start one of their own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import structlog
from opentelemetry.trace import SpanContext

from antdt.runtime.bus import Bus
from antdt.schemas import INCIDENT_STREAM, Incident, IncidentState, Subjects

log = structlog.get_logger("antdt.monitor")

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
    """The job's incidents left open on ANTDT_INCIDENTS (raises when it cannot read)."""
    subject = subjects.incident(job)
    for lookback in LOOKBACKS_S:
        since = None if lookback is None else now - lookback
        replay = await bus.jetstream.read(INCIDENT_STREAM, subject, Incident, limit=READ_LIMIT,
                                   since=since)  # fmt: skip
        if replay.available <= READ_LIMIT:
            break
        log.warning("job has more incidents than a take-over reads; reading later ones",
                    job=job, incidents=replay.available, since=since)  # fmt: skip
    ours = [(i, t) for i, t in zip(replay.items, replay.traces, strict=True) if i.job == job]
    first_trace: dict[str, SpanContext | None] = {}
    for incident, trace in ours:
        first_trace.setdefault(incident.id, trace)
    return [LeftOpen(i, first_trace[i.id]) for i in still_open(i for i, _ in ours)]
