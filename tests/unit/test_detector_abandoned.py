"""Jobs whose launcher gave up without the ranks saying so (a rank died with no restart
left, the allocation ended): after `abandon_after_s` of silence from every rank the
monitor ends the job, as if its ranks had exited."""

from __future__ import annotations

from antdt.schemas import ExitReason, IncidentKind, IncidentState, RankState
from antdt.services.monitor import JobDetector
from tests.unit.test_detector_exits import exit_of, states
from tests.unit.test_detector_restarts import LIMIT, crashed_job, hello

AFTER = 3600.0


def test_a_job_no_rank_was_heard_from_is_abandoned_and_ends_resolving_its_incidents() -> None:
    detector, hung = crashed_job()  # every rank stalled since its last step
    last_heard = hung - LIMIT - 1
    assert not detector.abandoned(last_heard + AFTER - 1, AFTER)
    assert not detector.abandoned(last_heard + AFTER, 0.0)  # 0: never
    now = last_heard + AFTER
    assert detector.abandoned(now, AFTER)
    resolved = detector.abandon(now)
    assert {(i.rank, i.kind, i.state) for i in resolved} == {
        (r, IncidentKind.STALLED, IncidentState.RESOLVED) for r in range(4)
    }
    assert detector.ended and detector.open_incidents == ()
    assert states(detector, now) == [RankState.EXITED] * 4
    assert detector.health(now).step == 199
    assert not detector.abandoned(now + AFTER, AFTER) and detector.check_stalls(now + 1) == []


def test_an_exit_or_a_hello_counts_as_heard_from() -> None:
    detector, hung = crashed_job()
    # Rank 0 exits to be restarted; the launcher never brings it back.
    detector.rank_exited(exit_of(0, ExitReason.RESTART, 199), hung)
    assert not detector.abandoned(hung + AFTER - 1, AFTER)
    # Another process of rank 1 starts (and never steps).
    detector.rank_started(hello(1, hung + 100), hung + 100)
    assert not detector.abandoned(hung + 100 + AFTER - 1, AFTER)
    assert detector.abandoned(hung + 100 + AFTER, AFTER)
    detector.abandon(hung + 100 + AFTER)
    assert states(detector, hung + 100 + AFTER) == [RankState.EXITED] * 4


def test_a_job_never_heard_from_or_ended_is_not_abandoned() -> None:
    detector, hung = crashed_job()
    for rank in range(4):
        detector.rank_exited(exit_of(rank, ExitReason.FINISHED, 199), hung)
    assert detector.ended and not detector.abandoned(hung + 10 * AFTER, AFTER)
    assert not JobDetector("fresh", 2).abandoned(10 * AFTER, AFTER)
