"""What a decision asks of the view's open incidents, found in one pass. Pure.

A decision asks several questions of the open incidents: which ranks are held
deviating, which are slow for their link or for their data, which incidents a batch
plan can help. With a crowd of stragglers that is thousands of incidents, and a pass
per question cost a millisecond each; one pass a view answers them all."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from antdt.schemas import Cause, Incident, IncidentKind, IncidentState
from antdt.services.controller.view import JobView


@dataclass(frozen=True)
class IncidentFacts:
    """The view's open (not resolved) SLOW and LEADER incidents, read five ways."""

    held: frozenset[int]  # their ranks, and the ranks of a host that slowed as one
    link_bound: frozenset[int]  # the same of SLOW ones caused by the rank's link
    data_bound: frozenset[int]  # the ranks of SLOW ones caused by the rank's data
    actionable: tuple[Incident, ...]  # those but the link-bound, in the view's order
    #: the latest step (0 at least) at which an actionable one's slow run began: its
    #: step less its `slow_for_steps` evidence (the monitor's history restarts there)
    latest_run_began: int = 0


def incident_facts(view: JobView) -> IncidentFacts:
    """The facts of `view.open_incidents` (once per view)."""
    return view.remembered("incident_facts", None, lambda: facts_of(view.open_incidents))


def facts_of(incidents: Sequence[Incident]) -> IncidentFacts:
    """The facts of `incidents`, in one pass."""
    held: set[int] = set()
    link_bound: set[int] = set()
    data_bound: set[int] = set()
    actionable: list[Incident] = []
    began = 0
    slow, leader, resolved = IncidentKind.SLOW, IncidentKind.LEADER, IncidentState.RESOLVED
    link, data = Cause.COMMUNICATION, Cause.DATA
    for incident in incidents:
        kind = incident.kind
        if (kind != slow and kind != leader) or incident.state == resolved:
            continue
        ranks = (incident.rank, *incident.host_ranks) if incident.host_ranks else (incident.rank,)
        held.update(ranks)
        cause = incident.cause if kind == slow else None
        if cause == link:
            link_bound.update(ranks)
            continue
        if cause == data:
            data_bound.add(incident.rank)
        actionable.append(incident)
        began = max(began, incident.step - int(incident.evidence.get("slow_for_steps", 0.0)))
    return IncidentFacts(
        frozenset(held), frozenset(link_bound), frozenset(data_bound), tuple(actionable), began
    )


__all__ = ["IncidentFacts", "facts_of", "incident_facts"]
