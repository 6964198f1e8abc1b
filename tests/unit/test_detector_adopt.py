"""A job's new owner carries on the incidents its previous owner left open: adopted under
their ids, moved on and resolved by the same rules (JobDetector.adopt, leftopen.py)."""

from __future__ import annotations

from antdt.runtime.coordination.leftopen import still_open
from antdt.schemas import IncidentKind, IncidentState, StragglerClass
from antdt.services.monitor import JobDetector
from tests.unit.test_detector import JOB, Job, event, run, slow_rank


def _taken_over(previous: JobDetector, world: int) -> JobDetector:
    """A fresh detector (a new owner's claim) that adopted what `previous` left open."""
    new = JobDetector(JOB, world, epoch=previous.epoch + 1)
    for incident in previous.open_incidents:
        assert new.adopt(incident, 2000.0) is None
    return new


def test_an_adopted_incident_resolves_under_its_id_once_the_rank_recovers() -> None:
    job = Job(4, cost=slow_rank(1, 3.0, start=40, stop=120))
    previous, _ = run(job, range(100))
    (left,) = previous.open_incidents
    assert left.rank == 1 and left.state is IncidentState.ESCALATED
    new = _taken_over(previous, 4)
    assert [i.id for i in new.open_incidents] == [left.id]
    assert new.health(2000.0).open_incidents == (left.id,)
    _, transitions = run(job, range(100, 200), new)
    # Without adoption the new owner saw a healthy job and said nothing: left open forever.
    assert [(i.id, i.state) for i in transitions] == [(left.id, IncidentState.RESOLVED)]
    assert transitions[0].straggler_class is StragglerClass.PERSISTENT
    assert new.open_incidents == ()


def test_an_adopted_incident_of_a_rank_still_slow_goes_on_and_none_opens_beside_it() -> None:
    job = Job(4, cost=slow_rank(2, 3.0, start=40))
    previous, _ = run(job, range(50))
    (left,) = previous.open_incidents
    assert left.state is IncidentState.OPENED
    new = _taken_over(previous, 4)
    _, transitions = run(job, range(50, 200), new)
    assert [(i.id, i.state) for i in transitions] == [(left.id, IncidentState.ESCALATED)]
    assert [i.id for i in new.open_incidents] == [left.id]


def test_an_adopted_deterministic_incident_stays_deterministic() -> None:
    job = Job(4, cost=slow_rank(3, 3.0))  # slow from its first window: hardware
    previous, _ = run(job, range(60))
    (left,) = previous.open_incidents
    assert left.straggler_class is StragglerClass.DETERMINISTIC
    new = _taken_over(previous, 4)
    _, transitions = run(job, range(60, 200), new)
    assert transitions == []  # never escalated: a deterministic one is not persistent
    assert new.open_incidents[0].straggler_class is StragglerClass.DETERMINISTIC


def test_an_adopted_stall_resolves_on_the_ranks_next_step() -> None:
    previous = JobDetector(JOB, 2)
    for step in range(16):
        for rank in range(2):
            previous.ingest(event(rank, step, t=1000.0 + step), 1000.0 + step)
    stalls = previous.check_stalls(1100.0)
    assert {i.kind for i in stalls} == {IncidentKind.STALLED} and len(stalls) == 2
    new = _taken_over(previous, 2)
    back = new.ingest(event(0, 16, t=1200.0), 1200.0)
    assert [(i.id, i.state) for i in back] == [(stalls[0].id, IncidentState.RESOLVED)]
    assert [i.id for i in new.open_incidents] == [stalls[1].id]


def test_what_cannot_be_carried_on_is_resolved_as_superseded() -> None:
    job = Job(4, cost=slow_rank(1, 3.0, start=40))
    previous, _ = run(job, range(50))
    (left,) = previous.open_incidents
    new, _ = run(job, range(50), JobDetector(JOB, 4, epoch=9))  # opened its own already
    superseded = new.adopt(left, 2000.0)
    assert superseded is not None and superseded.id == left.id
    assert superseded.state is IncidentState.RESOLVED and superseded.evidence["superseded"] == 1
    smaller = JobDetector(JOB, 1, epoch=9)  # the job came back with fewer ranks
    assert smaller.adopt(left, 2000.0) is not None and smaller.open_incidents == ()


def test_still_open_keeps_each_incidents_latest_transition_unless_resolved() -> None:
    job = Job(4, cost=slow_rank(1, 3.0, start=40, stop=100))
    _, transitions = run(job, range(200))  # opened, escalated, resolved
    assert transitions and still_open(transitions) == []
    assert still_open(transitions[:2]) == [transitions[1]]  # the escalation, not the opening
    other = Job(4, cost=slow_rank(2, 3.0, start=40))
    _, more = run(other, range(60), JobDetector(JOB, 4, epoch=5))
    assert [i.id for i in still_open([*transitions[:1], *more])] == [
        transitions[0].id,
        more[0].id,
    ]
