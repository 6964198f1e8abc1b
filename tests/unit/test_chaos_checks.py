"""The chaos soak's invariants over what a soak recorded (tests/chaos/checks.py): an
action applied twice, an incident left open with no fault near it."""

from __future__ import annotations

from antdt.schemas import ActionRecord, ActionResult, Incident, IncidentKind, IncidentState
from antdt.testing.faults import Fault, FaultKind, FaultRecord, advance
from tests.chaos.checks import (
    actions_applied_twice,
    open_incidents_without_reason,
    with_responses,
)

START = 1000.0  # the soak's start, Unix time


def action(action_id: str, result: ActionResult, at_s: float = 0.0) -> ActionRecord:
    return ActionRecord(
        action_id=action_id,
        job="j",
        kind="adjust_batch",
        policy="lb-bsp",
        reason="rebalance",
        decided_at=START + at_s,
        completed_at=START + at_s + 0.1,
        result=result,
    )


def incident(state: IncidentState, opened_s: float, key: str = "i") -> Incident:
    return Incident(
        id=key,
        job="j",
        rank=1,
        host="slot1",
        kind=IncidentKind.SLOW,
        state=state,
        step=5,
        opened_at=START + opened_s,
        updated_at=START + opened_s,
        ratio=2.0,
        windows=3,
    )


def recovered(at_s: float, back_s: float) -> FaultRecord:
    record = FaultRecord(Fault(0, at_s, FaultKind.PAUSE, "rank1", 4.0))
    return advance(advance(record, "injected", at_s), "recovered", back_s)


def test_an_action_applied_twice_is_found_and_its_other_results_are_not() -> None:
    records = [
        action("a1", ActionResult.APPLIED),
        action("a1", ActionResult.APPLIED),
        action("a2", ActionResult.APPLIED),
        action("a3", ActionResult.REFUSED),
        action("a3", ActionResult.REFUSED),
    ]
    assert actions_applied_twice(records) == ["action a1 applied 2 times"]
    assert actions_applied_twice(records[1:]) == []


def test_an_open_incident_needs_a_fault_or_the_jobs_end_near_it() -> None:
    faults = [recovered(10.0, 16.0)]
    resolved = [incident(IncidentState.OPENED, 100.0), incident(IncidentState.RESOLVED, 100.0)]
    assert open_incidents_without_reason(resolved, faults, 300.0, START) == []
    during = [incident(IncidentState.ESCALATED, 12.0)]
    after = [incident(IncidentState.OPENED, 16.0 + 29.0)]
    near_end = [incident(IncidentState.OPENED, 280.0)]
    for explained in (during, after, near_end):
        assert open_incidents_without_reason(explained, faults, 300.0, START) == []
    unexplained = [incident(IncidentState.OPENED, 100.0, key="lost")]
    problems = open_incidents_without_reason(unexplained, faults, 300.0, START)
    assert len(problems) == 1 and "lost" in problems[0] and "100.0 s" in problems[0]


def test_each_fault_is_told_the_incidents_opened_and_actions_decided_while_it_lasted() -> None:
    pause = recovered(10.0, 16.0)
    held = advance(FaultRecord(Fault(1, 30.0, FaultKind.KILL_NATS, "nats0", 4.0)), "injected", 30.0)
    incidents = [
        incident(IncidentState.OPENED, 12.0),
        incident(IncidentState.ESCALATED, 13.0),  # the same incident, not opened again
        incident(IncidentState.OPENED, 40.0, key="later"),  # after both faults
    ]
    actions = [
        action("a1", ActionResult.APPLIED, at_s=15.0),
        action("a2", ActionResult.APPLIED, 33.0),
    ]
    told = with_responses([pause, held], incidents, actions, START)
    assert told[0].note == "incident slow r1; action adjust_batch applied"
    assert told[1].note == "action adjust_batch applied"  # held until 30 + 4 s
    assert with_responses([pause], [], [], START)[0].note == ""
