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
    #: per rank of an actionable one, the step (0 at least) its slow run began: the
    #: incident's step less its `slow_for_steps` evidence (the monitor's history of the
    #: rank restarts there); the latest where a rank has several
    runs_began: tuple[tuple[int, int], ...] = ()

    @property
    def latest_run_began(self) -> int:
        """The latest step at which an actionable incident's slow run began (0: none)."""
        return max((began for _, began in self.runs_began), default=0)

    def runs_began_after(self, step: int) -> frozenset[int]:
        """The ranks whose slow run began after `step`."""
        return frozenset(rank for rank, began in self.runs_began if began > step)


def incident_facts(view: JobView) -> IncidentFacts:
    """The facts of `view.open_incidents` (once per view)."""
    return view.remembered("incident_facts", None, lambda: facts_of(view.open_incidents))


def facts_of(incidents: Sequence[Incident]) -> IncidentFacts:
    """The facts of `incidents`, in one pass. Lean per incident (a crowd of stragglers
    is thousands of them at every decision): a rank alone added as itself, a run's
    start kept without a default to compare."""
    held: set[int] = set()
    link_bound: set[int] = set()
    data_bound: set[int] = set()
    actionable: list[Incident] = []
    began: dict[int, int] = {}
    slow, leader, resolved = IncidentKind.SLOW, IncidentKind.LEADER, IncidentState.RESOLVED
    link, data = Cause.COMMUNICATION, Cause.DATA
    for incident in incidents:
        kind = incident.kind
        if (kind != slow and kind != leader) or incident.state == resolved:
            continue
        rank, others = incident.rank, incident.host_ranks
        held.add(rank)
        if others:
            held.update(others)
        cause = incident.cause if kind == slow else None
        if cause == link:
            link_bound.add(rank)
            if others:
                link_bound.update(others)
            continue
        if cause == data:
            data_bound.add(rank)
        actionable.append(incident)
        run = incident.step - int(incident.evidence.get("slow_for_steps", 0.0))
        known = began.get(rank)
        if known is None or run > known:
            began[rank] = run if run > 0 else 0
    return IncidentFacts(
        frozenset(held),
        frozenset(link_bound),
        frozenset(data_bound),
        tuple(actionable),
        tuple(began.items()),
    )


__all__ = ["IncidentFacts", "facts_of", "incident_facts"]
