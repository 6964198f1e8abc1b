"""Ranks whose process starts again (RankHello) while the job is watched: a job restarted
from a checkpoint steps again from there, and the monitor follows it from its first step."""

from __future__ import annotations

from antdt.schemas import ExitReason, IncidentKind, IncidentState, RankHello, RankState
from antdt.services.monitor import DetectorConfig, JobDetector
from tests.unit.test_detector import JOB, Job, event, run, slow_rank
from tests.unit.test_detector_exits import exit_of, states

LIMIT = DetectorConfig().min_stall_s  # the steps here are short: the floor applies
GRACE = DetectorConfig().restart_grace_s


def hello(rank: int, at: float, *, host: str = "", job: str = JOB, world: int = 4) -> RankHello:
    return RankHello(
        job=job, rank=rank, world_size=world, host=host or f"h{rank}", pid=2, started_at=at
    )


def crashed_job() -> tuple[JobDetector, float]:
    """Four healthy ranks ran steps 0-199; then a rank died and the job hung: every rank
    is stalled (the launcher restarts the group from the checkpoint after step 149)."""
    detector, _ = run(Job(4), range(200))
    hung = detector.health(0.0).at + LIMIT + 1
    stalls = detector.check_stalls(hung)
    assert {(i.rank, i.kind) for i in stalls} == {(r, IncidentKind.STALLED) for r in range(4)}
    return detector, hung


def test_a_job_restarted_from_an_earlier_checkpoint_is_watched_again_from_its_first_step() -> None:
    detector, now = crashed_job()
    for rank in range(4):
        detector.rank_started(hello(rank, now), now)
    assert states(detector, now) == [RankState.RESTARTING] * 4
    assert detector.health(now).step == 199  # until the restarted run's first step
    assert detector.check_stalls(now + LIMIT + GRACE - 1) == []  # starting up takes time
    _, first = run(Job(4, t0=now + 30), range(150, 151), detector)
    assert detector.health(now + 31).step == 150  # the job went back to its checkpoint
    # The restarted run steps again from 150, with the old steps' figures.
    _, rest = run(Job(4, t0=now + 31), range(151, 260), detector)
    transitions = first + rest
    assert detector.rejected == {}
    resolved = [i for i in transitions if i.state is IncidentState.RESOLVED]
    assert {(i.rank, i.kind, i.step) for i in resolved} == {
        (r, IncidentKind.STALLED, 150) for r in range(4)
    }
    assert detector.open_incidents == ()
    health = detector.health(now + 40)
    assert health.step == 259 and health.step_s > 0
    assert states(detector, now + 40) == [RankState.OK] * 4


def test_without_a_hello_a_step_back_is_still_refused() -> None:
    detector, now = crashed_job()
    run(Job(4, t0=now + 30), range(150, 160), detector)
    assert detector.rejected["step_backwards"] == 40
    assert states(detector, now + 40) == [RankState.STALLED] * 4


def test_a_rank_restarted_on_a_healthy_host_is_measured_afresh_and_its_incident_resolves() -> None:
    """KILL_RESTART of a slow rank: the group checkpoints after step 199 and exits; rank 3
    comes back on a spare host. Its SLOW incident stays open through the restart (the
    restart is the mitigation) and resolves on the new process's normal windows."""
    detector, _ = run(Job(4, cost=slow_rank(3, 3.0, start=30)), range(200))
    slow_id = detector.open_incidents[0].id
    now = detector.health(0.0).at
    for rank in range(4):
        detector.rank_exited(exit_of(rank, ExitReason.RESTART, 199), now)
    for rank in range(4):
        detector.rank_started(hello(rank, now + 5, host="spare3" if rank == 3 else ""), now + 5)
    assert [i.id for i in detector.open_incidents] == [slow_id]
    restarted = detector.health(now + 5).ranks[3]
    assert (restarted.host, restarted.samples_per_s) == ("spare3", 0.0)  # the old speed is gone
    _, transitions = run(Job(4, t0=now + 20), range(200, 260), detector)
    assert [(i.id, i.state, i.host) for i in transitions] == [
        (slow_id, IncidentState.RESOLVED, "h3")  # opened on the old host
    ]


def test_a_rank_restarted_in_place_that_never_steps_stalls_after_the_grace() -> None:
    """Rank 2's process is restarted while the others go on (an elastic job)."""
    detector, _ = run(Job(4), range(200))
    now = detector.health(0.0).at
    detector.rank_started(hello(2, now), now)
    deadline = now + LIMIT + GRACE
    for step in range(200, 200 + int(GRACE + LIMIT + 2) * 2):
        t = now + (step - 199) * 0.5
        for rank in (0, 1, 3):
            detector.ingest(event(rank, step, t=t), t + 0.034)
        stalls = detector.check_stalls(t)
        if t < deadline - 0.5:
            assert stalls == [], f"stalled at {t - now:.1f} s, before the grace"
        elif stalls:
            assert [(i.rank, i.kind) for i in stalls] == [(2, IncidentKind.STALLED)]
            return
    raise AssertionError("the restarted rank never stalled")


def test_hellos_that_are_stale_or_foreign_are_counted_and_change_nothing() -> None:
    detector, now = crashed_job()
    detector.rank_started(hello(1, now), now)
    before = detector.health(now)
    detector.rank_started(hello(1, now - 60), now)  # an older process's, arriving late
    detector.rank_started(hello(0, now, job="other"), now)
    detector.rank_started(hello(4, now, world=5), now)
    detector.rank_started(hello(0, now, world=8), now)
    assert detector.rejected == {
        "stale_hello": 1,
        "wrong_job": 1,
        "rank_out_of_range": 1,
        "world_size_mismatch": 1,
    }
    assert detector.health(now) == before
