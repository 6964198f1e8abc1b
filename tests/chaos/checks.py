"""The invariants a soak must keep, as pure functions of what it recorded: each returns
the problems found (an empty list: kept); and what the services did during each fault."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from antdt.schemas import ActionRecord, ActionResult, Incident, IncidentState
from antdt.testing.faults import FaultRecord

#: How long after a fault is undone an incident it caused may still be open, seconds: a
#: detector window or two at the soak's step rate.
AFTERMATH_S = 30.0


def actions_applied_twice(actions: Sequence[ActionRecord]) -> list[str]:
    """Action ids with more than one APPLIED record."""
    applied = Counter(a.action_id for a in actions if a.result is ActionResult.APPLIED)
    return [f"action {aid} applied {n} times" for aid, n in sorted(applied.items()) if n > 1]


def open_incidents_without_reason(
    incidents: Sequence[Incident],
    records: Sequence[FaultRecord],
    ended_at: float,
    start_wall: float,
) -> list[str]:
    """Incidents whose last state is not RESOLVED and that no fault explains: one that
    opened while a fault was held (or within AFTERMATH_S of its end), or that opened
    within AFTERMATH_S of the job's end (the monitor had no window left to resolve it).
    Times: seconds from the soak's start, which was Unix time `start_wall`."""
    last: dict[str, Incident] = {}
    for incident in incidents:
        last[incident.id] = incident
    problems = []
    for incident in last.values():
        if incident.state is IncidentState.RESOLVED:
            continue
        if _reason(incident.opened_at - start_wall, records, ended_at) is None:
            problems.append(
                f"incident {incident.id} ({incident.kind.value}, rank {incident.rank}) "
                f"open since {incident.opened_at - start_wall:.1f} s with no fault near it"
            )
    return problems


def _reason(opened: float, records: Sequence[FaultRecord], ended_at: float) -> str | None:
    if ended_at - opened <= AFTERMATH_S:
        return "opened near the job's end"
    for record in records:
        if record.injected_s is None:
            continue
        end = record.recovered_s if record.recovered_s is not None else ended_at
        if record.injected_s <= opened <= end + AFTERMATH_S:
            return f"fault {record.fault.number}"
    return None


def with_responses(
    records: Sequence[FaultRecord],
    incidents: Sequence[Incident],
    actions: Sequence[ActionRecord],
    start_wall: float,
) -> list[FaultRecord]:
    """`records` with what the services did while each fault lasted (from its injection
    to its recovery, or its hold's end) added to its note: incidents opened (kind and
    rank) and actions decided (kind and result)."""
    annotated = []
    for record in records:
        if record.injected_s is None:
            annotated.append(record)
            continue
        start = start_wall + record.injected_s
        end = start_wall + (record.recovered_s or record.injected_s + record.fault.hold_s)
        opened = sorted(
            {
                f"{i.kind.value} r{i.rank}"
                for i in incidents
                if i.state is IncidentState.OPENED and start <= i.opened_at <= end
            }
        )
        decided = sorted(
            {f"{a.kind} {a.result.value}" for a in actions if start <= a.decided_at <= end}
        )
        said = [f"incident {', '.join(opened)}"] if opened else []
        said += [f"action {', '.join(decided)}"] if decided else []
        note = "; ".join(part for part in [record.note, *said] if part)
        annotated.append(replace(record, note=note))
    return annotated
