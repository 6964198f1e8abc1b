"""Ranks that stop on purpose (RankExit): a finished job is not a stalled one."""

from __future__ import annotations

from antdt.schemas import ExitReason, IncidentKind, IncidentState, RankExit, RankState
from antdt.services.monitor import DetectorConfig, JobDetector
from tests.unit.test_detector import JOB, Job, event, opened, run, slow_rank

LIMIT = DetectorConfig().min_stall_s  # the steps here are short: the floor applies
GRACE = DetectorConfig().restart_grace_s


def exit_of(rank: int, reason: ExitReason, step: int, job: str = JOB) -> RankExit:
    return RankExit(job=job, rank=rank, host=f"h{rank}", pid=1, reason=reason, step=step, at=0.0)


def slow_job(steps: int = 200) -> tuple[JobDetector, float]:
    """Four ranks, rank 3 three times slower from step 30: its SLOW incident is open."""
    detector, transitions = run(Job(4, cost=slow_rank(3, 3.0, start=30)), range(steps))
    assert [i.rank for i in opened(transitions)] == [3]
    return detector, detector.health(0.0).at


def states(detector: JobDetector, now: float) -> list[RankState]:
    return [r.state for r in detector.health(now).ranks]


def test_a_job_whose_ranks_all_finished_ends_resolves_its_incidents_and_never_stalls() -> None:
    detector, now = slow_job()
    slow_id = detector.open_incidents[0].id
    for rank in (0, 1, 2):
        assert detector.rank_exited(exit_of(rank, ExitReason.FINISHED, 199), now + 0.1) == []
    assert not detector.ended
    last = detector.rank_exited(exit_of(3, ExitReason.FINISHED, 199), now + 0.2)
    assert [(i.id, i.state, i.evidence["exited"], i.step) for i in last] == [
        (slow_id, IncidentState.RESOLVED, 1.0, 199)  # resolved at the exit, not the onset
    ]
    assert detector.ended and detector.open_incidents == ()
    assert states(detector, now + 1) == [RankState.EXITED] * 4
    assert detector.check_stalls(now + 10 * LIMIT + GRACE) == []


def test_exits_that_overtake_the_last_steps_end_the_job_at_the_exits_step() -> None:
    """Exits and steps come on subscriptions of their own: the monitor may see the ranks
    exit at step 20 while it has ingested up to step 12 only. The job ended at 20 (its
    health says so, and the service drops steps up to it as late), not at 12."""
    detector = run(Job(2), range(13))[0]
    assert detector.health(2000.0).step == 12
    for rank in (0, 1):
        detector.rank_exited(exit_of(rank, ExitReason.FINISHED, 20), 2000.0)
    assert detector.ended and detector.health(2000.0).step == 20


def test_a_rank_that_finished_is_not_stalled_while_the_others_still_run() -> None:
    detector, now = run(Job(3), range(50))[0], 1000.0 + 50 * 0.034
    detector.rank_exited(exit_of(0, ExitReason.FINISHED, 49), now)
    for step in range(50, 80):  # ranks 1 and 2 go on for a while
        for rank in (1, 2):
            detector.ingest(event(rank, step, t=now), now + (step - 49) * 0.5)
    later = now + 15.0 + LIMIT
    assert detector.check_stalls(later) == []
    assert states(detector, later) == [RankState.EXITED, RankState.OK, RankState.OK]


def test_a_rank_closed_mid_job_drops_its_slow_incident_but_its_silence_is_a_stall() -> None:
    detector, now = slow_job()
    slow_id = detector.open_incidents[0].id
    closed = detector.rank_exited(exit_of(3, ExitReason.CLOSED, 199), now)
    assert [(i.id, i.state, i.step) for i in closed] == [(slow_id, IncidentState.RESOLVED, 199)]
    for step in range(200, 600):  # the others go on (an elastic job)
        for rank in (0, 1, 2):
            detector.ingest(event(rank, step, t=now), now + (step - 199) * 0.05)
    stalls = detector.check_stalls(now + 20.0 + LIMIT)
    assert [(i.rank, i.kind) for i in stalls] == [(3, IncidentKind.STALLED)]
    assert not detector.ended


def test_ranks_exiting_to_restart_keep_their_incident_and_stall_only_after_the_grace() -> None:
    detector, now = slow_job()
    slow_id = detector.open_incidents[0].id
    for rank in range(4):
        assert detector.rank_exited(exit_of(rank, ExitReason.RESTART, 199), now) == []
    assert not detector.ended
    assert [i.id for i in detector.open_incidents] == [slow_id]  # the restart mitigates it
    assert states(detector, now) == [RankState.RESTARTING] * 4
    assert detector.check_stalls(now + LIMIT + GRACE - 1) == []
    assert detector.check_stalls(now + LIMIT + GRACE + 1) != []  # a restart that never came


def test_a_restarted_rank_is_back_at_its_next_step_but_not_at_a_late_old_one() -> None:
    detector, now = slow_job()
    detector.rank_exited(exit_of(0, ExitReason.RESTART, 199), now)
    detector.ingest(event(0, 199, t=now), now)  # in flight from the old process: a duplicate
    assert states(detector, now)[0] == RankState.RESTARTING
    detector.ingest(event(0, 200, t=now + 5), now + 5)
    assert states(detector, now + 5)[0] != RankState.RESTARTING


def test_exits_for_another_job_or_rank_are_counted_and_change_nothing() -> None:
    detector, now = slow_job()
    before = detector.health(now)
    assert detector.rank_exited(exit_of(0, ExitReason.FINISHED, 9, job="other"), now) == []
    assert detector.rank_exited(exit_of(7, ExitReason.FINISHED, 9), now) == []
    assert detector.rejected["wrong_job"] == 1 and detector.rejected["rank_out_of_range"] == 1
    assert detector.health(now) == before


def test_a_job_whose_ranks_all_closed_without_the_shards_service_ends_too() -> None:
    detector, now = run(Job(2), range(50))[0], 1000.0 + 50 * 0.034
    detector.rank_exited(exit_of(0, ExitReason.CLOSED, 49), now)
    detector.rank_exited(exit_of(1, ExitReason.CLOSED, 49), now + 3)
    assert detector.ended
    assert detector.check_stalls(now + 10 * LIMIT) == []
