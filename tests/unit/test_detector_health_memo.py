"""A health's job figures (step time, throughput, balance) are made again only when a
rank's latest window changed (a window closed, a rank started again), and its models
looked at only for the ranks whose window or history changed: every health equals one
made afresh from the ranks, each rank's model checked on its own."""

from __future__ import annotations

from antdt.schemas import JobHealth
from antdt.services.monitor import JobDetector
from antdt.services.monitor.ranks import JobProgress, job_health
from tests.unit.test_detector import JOB, Job, slow_rank
from tests.unit.test_detector_restarts import hello


def afresh(detector: JobDetector, health: JobHealth) -> JobHealth:
    """The health made from the detector's ranks with no job-wide memo: each rank's
    model checked against its window, history and the job's fixed part."""
    progress = JobProgress(
        health.job, health.at, health.step, health.plan_version, health.open_incidents
    )
    ranks = detector._ranks
    return job_health(ranks, progress, [detector._pace.model(rank) for rank in ranks])


def watched(detector: JobDetector, job: Job, steps: range) -> int:
    """Ingest the job's steps, a health after each step compared to one made afresh;
    the healths whose job figures differ from the previous one's."""
    changed, last = 0, None
    events = list(job.events(steps))
    for i, (now, event) in enumerate(events):
        detector.ingest(event, now)
        if event.rank == job.world - 1 or i == len(events) - 1:
            health = detector.health(now)
            assert health == afresh(detector, health), event.step
            models = [detector._pace.model(rank) for rank in detector._ranks]
            parts = [(None, None) if m is None else (m.fixed_s, m.per_sample_s) for m in models]
            assert list(zip(health.ranks.fixed_s, health.ranks.per_sample_s, strict=True)) == parts
            figures = (health.step_s, health.samples_per_s, health.balance_efficiency)
            changed += figures != last
            last = figures
    return changed


def batch(rank: int, step: int) -> float:
    return 32 if step < 120 or rank % 2 else 20


def test_every_health_is_made_of_the_ranks_as_they_are_now() -> None:
    job = Job(8, cost=slow_rank(3, 2.5, start=60, stop=200), batch=batch, jitter=0.1, seed=3)
    detector = JobDetector(JOB, 8)
    changed = watched(detector, job, range(260))
    assert 20 < changed < 260  # made again at closes, kept between them
    now = detector.health(0.0).at + 1.0
    for rank in (2, 5):
        detector.rank_started(hello(rank, now, world=8), now)
    health = detector.health(now)
    assert health == afresh(detector, health)
    watched(detector, Job(8, batch=batch, seed=4, t0=now + 1.0), range(260, 330))
