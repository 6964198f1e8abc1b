"""The facts a decision reads of the open incidents, found in one pass, are what each
question asked of them one by one says."""

from __future__ import annotations

import random

import pytest

from antdt.schemas import Cause, Incident, IncidentKind, IncidentState
from antdt.services.controller.policies.incident_facts import IncidentFacts, facts_of

KINDS = list(IncidentKind)
CAUSES = list(Cause)
STATES = list(IncidentState)


def _incident(rnd: random.Random, n: int) -> Incident:
    rank = rnd.randrange(16)
    host_ranks = tuple(sorted({rank, *rnd.sample(range(16), 2)})) if rnd.random() < 0.2 else None
    return Incident(
        id=f"i{n}",
        job="facts",
        rank=rank,
        host=f"h{rank}",
        kind=rnd.choice(KINDS),
        cause=rnd.choice(CAUSES),
        state=rnd.choice(STATES),
        step=n,
        opened_at=1.0,
        updated_at=2.0,
        ratio=2.0,
        windows=1,
        evidence={"slow_for_steps": float(rnd.randrange(8))} if rnd.random() < 0.5 else {},
        host_ranks=host_ranks,
    )


def _open(i: Incident) -> bool:
    return i.state != IncidentState.RESOLVED


def _slow_for(i: Incident, cause: Cause) -> bool:
    return i.kind == IncidentKind.SLOW and i.cause == cause and _open(i)


def _ranks(i: Incident) -> set[int]:
    return {i.rank, *(i.host_ranks or ())}


@pytest.mark.parametrize("seed", range(40))
def test_one_pass_answers_as_each_question_asked_alone(seed: int) -> None:
    rnd = random.Random(seed)
    incidents = [_incident(rnd, n) for n in range(rnd.randrange(0, 30))]
    facts = facts_of(incidents)
    held_kinds = (IncidentKind.SLOW, IncidentKind.LEADER)
    held = [i for i in incidents if i.kind in held_kinds and _open(i)]
    assert facts.held == {r for i in held for r in _ranks(i)}
    link = [i for i in incidents if _slow_for(i, Cause.COMMUNICATION)]
    assert facts.link_bound == {r for i in link for r in _ranks(i)}
    assert facts.data_bound == {i.rank for i in incidents if _slow_for(i, Cause.DATA)}
    assert facts.actionable == tuple(i for i in held if i not in link)
    runs = [i.step - int(i.evidence.get("slow_for_steps", 0.0)) for i in facts.actionable]
    assert facts.latest_run_began == max([0, *runs])
    for step in (0, 10, 50):
        after = {i.rank for i, run in zip(facts.actionable, runs, strict=True) if run > step}
        assert facts.runs_began_after(step) == after


def test_resolved_stalled_and_link_bound_incidents_are_not_actionable() -> None:
    rnd = random.Random(7)
    base = _incident(rnd, 0)
    slow = base.model_copy(update={"kind": IncidentKind.SLOW, "state": IncidentState.OPENED})
    stalled = slow.model_copy(update={"id": "s", "kind": IncidentKind.STALLED})
    resolved = slow.model_copy(update={"id": "r", "state": IncidentState.RESOLVED})
    link = slow.model_copy(update={"id": "l", "cause": Cause.COMMUNICATION})
    compute = slow.model_copy(update={"id": "c", "cause": Cause.COMPUTE})
    facts = facts_of([stalled, resolved, link, compute])
    assert facts.actionable == (compute,)


def _reference_facts(incidents: list[Incident]) -> IncidentFacts:
    """facts_of as it read each incident before its lean pass."""
    held: set[int] = set()
    link_bound: set[int] = set()
    data_bound: set[int] = set()
    actionable: list[Incident] = []
    began: dict[int, int] = {}
    for incident in incidents:
        if incident.kind not in (IncidentKind.SLOW, IncidentKind.LEADER) or not _open(incident):
            continue
        ranks = (incident.rank, *incident.host_ranks) if incident.host_ranks else (incident.rank,)
        held.update(ranks)
        cause = incident.cause if incident.kind == IncidentKind.SLOW else None
        if cause == Cause.COMMUNICATION:
            link_bound.update(ranks)
            continue
        if cause == Cause.DATA:
            data_bound.add(incident.rank)
        actionable.append(incident)
        run = max(0, incident.step - int(incident.evidence.get("slow_for_steps", 0.0)))
        began[incident.rank] = max(run, began.get(incident.rank, 0))
    return IncidentFacts(
        frozenset(held),
        frozenset(link_bound),
        frozenset(data_bound),
        tuple(actionable),
        tuple(began.items()),
    )


@pytest.mark.parametrize("seed", range(100))
def test_the_lean_pass_is_the_plain_one(seed: int) -> None:
    """Every fact, the runs' starts in their order included, on incidents whose ranks
    repeat, whose runs begin before step 0, at it, or later than another's."""
    rnd = random.Random(seed)
    incidents = [_incident(rnd, n) for n in range(rnd.randrange(0, 60))]
    incidents = [
        i.model_copy(update={"step": rnd.randrange(12)}) if rnd.random() < 0.5 else i
        for i in incidents
    ]
    assert facts_of(incidents) == _reference_facts(incidents)
