"""Bad input never reaches the detector's figures: counted under a reason and ignored
(JobDetector.rejected), whatever order, duplicates or poisoned values arrive."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from antdt.schemas import StepEvent
from antdt.services.monitor import DetectorConfig, JobDetector
from tests.unit.test_detector import JOB, Job, W, event, run, slow_rank


def test_bad_events_are_counted_and_change_nothing() -> None:
    detector = JobDetector(JOB, 4)
    for step in range(W):
        for rank in range(4):
            detector.ingest(event(rank, step + 10, t=100.0 + step), 100.0 + step)
    slow = {"compute_s": 3.0, "step_s": 3.1}
    bad = [
        event(0, 17, t=200.0, **slow),  # duplicate of step 17
        event(0, 3, t=200.0, **slow),  # step going backwards
        event(1, 30, t=50.0, **slow),  # time going backwards
        event(7, 30, t=300.0, **slow),  # rank outside the job
    ]
    for ev in bad * 5:
        assert detector.ingest(ev, 300.0) == []
    assert detector.ingest(event(0, 40).model_copy(update={"job": "other"}), 300.0) == []
    assert detector.rejected == {
        "duplicate_step": 5,
        "step_backwards": 5,
        "time_backwards": 5,
        "rank_out_of_range": 5,
        "wrong_job": 1,
    }
    assert detector.open_incidents == ()
    assert detector.health(300.0).step == 17


def test_events_that_bypassed_validation_are_rejected_not_trusted() -> None:
    """NaN, infinite or negative durations and times, negative ranks: counted, ignored."""
    detector, _ = run(Job(4), range(2 * W))
    nan, inf = float("nan"), float("inf")
    poisoned = [
        {"compute_s": nan},
        {"compute_s": -0.5},
        {"step_s": inf},
        {"data_wait_s": -1.0},
        {"comm_s": nan},
        {"ended_at": nan},
        {"started_at": -5.0},
        {"ended_at": 1.0, "started_at": 2.0},
        {"ended_at": inf},
        {"rank": -1},
    ]
    for n, update in enumerate(poisoned):
        ev = event(0, 2 * W + n, t=5000.0).model_copy(update=update)
        assert detector.ingest(ev, 5000.0) == []
    assert detector.rejected == {"bad_duration": 5, "bad_time": 4, "rank_out_of_range": 1}
    # Nothing was remembered: the next real steps are accepted and the job stays healthy.
    _, transitions = run(Job(4), range(2 * W, 6 * W), detector)
    assert transitions == [] and detector.open_incidents == ()
    assert detector.health(6000.0).ranks[0].last_step == 6 * W - 1


def test_late_duplicate_and_time_travelling_events_never_alarm_a_slow_rank_free_job() -> None:
    """Out-of-order delivery of a healthy job with a huge outlier in every bad event."""
    detector = JobDetector(JOB, 3)
    rng = random.Random(3)
    for now, ev in Job(3, jitter=0.1).events(range(12 * W)):
        assert detector.ingest(ev, now) == []
        if rng.random() < 0.3 and ev.step > 2:
            slow = {"compute_s": 9.0, "step_s": 9.1, "samples": 1}
            late = ev.model_copy(update={"step": ev.step - rng.randint(1, 2), **slow})
            dup = ev.model_copy(update=slow)
            back = ev.model_copy(
                update={
                    "step": ev.step + 1,
                    "started_at": ev.started_at - 50.0,
                    "ended_at": ev.ended_at - 50.0,
                    **slow,
                }
            )
            for bad in (late, dup, back):
                assert detector.ingest(bad, now) == []
    assert set(detector.rejected) <= {"step_backwards", "duplicate_step", "time_backwards"}
    assert sum(detector.rejected.values()) > 50
    assert detector.open_incidents == ()


def test_clock_going_backwards_is_clamped() -> None:
    detector = JobDetector(JOB, 2)
    detector.ingest(event(0, 0), 50.0)
    assert detector.health(10.0).at == 50.0


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        DetectorConfig(window=0)
    with pytest.raises(ValueError):
        DetectorConfig(slow_threshold=1.5)
    with pytest.raises(ValueError):
        DetectorConfig(instant_threshold=0.1)
    with pytest.raises(ValueError):
        JobDetector(JOB, 0)


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False), st.floats(0.0, 0.1))
def test_reordered_duplicated_delivery_of_a_healthy_job_never_alarms(
    rnd: random.Random, jitter: float
) -> None:
    events = list(Job(4, jitter=jitter, seed=rnd.randint(0, 99)).events(range(60)))
    delivered = events + rnd.sample(events, len(events) // 3)  # duplicates
    # Local reordering, as a bus with several connections may deliver.
    for i in range(0, len(delivered) - 5, 5):
        chunk = delivered[i : i + 5]
        rnd.shuffle(chunk)
        delivered[i : i + 5] = chunk
    detector = JobDetector(JOB, 4)
    for now, ev in delivered:
        assert detector.ingest(ev, now) == []


def test_bad_events_never_reach_the_speed_models_or_the_evidence() -> None:
    """A straggler's events poisoned in every way the core refuses (and a step of no
    samples, seen but not measured) leave the models and the incidents as they were."""
    job = Job(4, cost=slow_rank(3, 1.5, start=3 * W), jitter=0.05, seed=2)
    clean, clean_transitions = run(job, range(12 * W))
    poisoned = JobDetector(JOB, 4)
    transitions = []
    for now, ev in job.events(range(12 * W)):
        transitions.extend(poisoned.ingest(ev, now))
        for update in ({"compute_s": float("nan")}, {"step": ev.step}, {"samples": -1}):
            assert poisoned.ingest(ev.model_copy(update=update), now) == []
    assert sum(poisoned.rejected.values()) == 3 * 12 * W * 4
    assert [(i.id, i.state) for i in transitions] == [(i.id, i.state) for i in clean_transitions]
    assert poisoned.health(1e9).ranks == clean.health(1e9).ranks
    assert poisoned.health(1e9).ranks[3].per_sample_s is not None


def test_work_sharing_help_is_summed_per_owner_and_bad_owners_are_refused() -> None:
    def helping(rank: int, step: int, samples: int, helped: dict[int, int]) -> StepEvent:
        return event(rank, step, samples=samples).model_copy(update={"helped": helped})

    detector = JobDetector(JOB, 3)
    for step in range(3):
        detector.ingest(helping(0, step, 40, {2: 8}), 100.0 + step)
        detector.ingest(helping(1, step, 36, {2: 4}), 100.0 + step)
        detector.ingest(event(2, step, samples=20), 100.0 + step)
    for owner in (0, 3):  # itself, a rank outside the job
        assert detector.ingest(helping(0, 9, 36, {owner: 4}), 110.0) == []
    assert detector.rejected == {"helped_out_of_range": 2}
    shown = {r.rank: r.helped for r in detector.health(110.0).ranks}
    assert shown == {0: {2: 24}, 1: {2: 12}, 2: None}


def test_a_step_counting_more_samples_than_the_detector_keeps_is_refused() -> None:
    """The wire bounds no count: a step of 2**70 samples (or planned batch) is counted
    and ignored, never written into the rank's int64 history (it raised there)."""
    from antdt.services.monitor import StepColumns

    detector = JobDetector(JOB, 2)
    row = (JOB, 0, "h0", 1, 0, 32, 0.0, 0.1, 32, 0.08, 0.0, 0.01, 0.1)
    for at, value in ((8, 2**70), (5, 2**70), (8, 2**41)):
        assert detector.ingest_fields((*row[:at], value, *row[at + 1 :]), 1.0) == []  # type: ignore[arg-type]
    columns = [[0, 1], ["h0", "h1"], [1, 1], [0, 0], [32, 32], [0.0] * 2, [0.1] * 2]
    columns += [[32, 2**62], [0.08] * 2, [0.0] * 2, [0.01] * 2, [0.1] * 2]
    detector.ingest_step(StepColumns(JOB, *columns), 1.0)  # type: ignore[arg-type]
    assert detector.rejected == {"bad_samples": 4}
    assert [r.last_step for r in detector._ranks] == [1, -1]


def test_a_step_past_what_the_detector_reads_as_int64_is_refused() -> None:
    """A step of 2**63 passed the wire and, kept as a rank's latest, broke every later
    health and bulk screen (int64): counted as bad_step and ignored."""
    from antdt.services.monitor import StepColumns

    detector = JobDetector(JOB, 2)
    row = (JOB, 0, "h0", 2**63, 0, 32, 0.0, 0.1, 32, 0.08, 0.0, 0.01, 0.1)
    assert detector.ingest_fields(row, 1.0) == []  # type: ignore[arg-type]
    columns = [[0, 1], ["h0", "h1"], [2**62 + 1, 1], [0, 0], [32, 32], [0.0] * 2, [0.1] * 2]
    columns += [[32, 32], [0.08] * 2, [0.0] * 2, [0.01] * 2, [0.1] * 2]
    detector.ingest_step(StepColumns(JOB, *columns), 1.0)  # type: ignore[arg-type]
    assert detector.rejected == {"bad_step": 2}
    assert detector.health(1.0).ranks.last_step == (0, 1)


def test_a_link_round_trip_that_is_not_a_number_in_range_is_refused() -> None:
    """The detector keeps every rank's latest round trip in a float block: a string, a
    negative or an infinite one is counted as bad_link_rtt and its step ignored, from
    an event or a step's columns (a list or an array, NaN there for none heard)."""
    import numpy as np

    from antdt.services.monitor import StepColumns

    detector = JobDetector(JOB, 3)
    row = (JOB, 0, "h0", 1, 0, 32, 0.0, 0.1, 32, 0.08, 0.0, 0.01, 0.1)
    for bad in ("7", -0.5, float("inf"), float("nan")):
        assert detector.ingest_fields((*row, bad), 1.0) == []  # type: ignore[arg-type]
    columns = [[0, 1, 2], ["h0", "h1", "h2"], [1] * 3, [0] * 3, [32] * 3, [0.0] * 3]
    columns += [[0.1] * 3, [32] * 3, [0.08] * 3, [0.0] * 3, [0.01] * 3, [0.1] * 3]
    detector.ingest_step(StepColumns(JOB, *columns, ["x", 0.002, None]), 1.0)  # type: ignore[arg-type]
    assert detector.rejected == {"bad_link_rtt": 5}
    assert [r.link_rtt_s for r in detector._ranks] == [None, 0.002, None]
    columns[2] = [2] * 3
    links = np.array([0.003, np.inf, np.nan])
    detector.ingest_step(StepColumns(JOB, *columns, links), 2.0)  # type: ignore[arg-type]
    assert detector.rejected == {"bad_link_rtt": 6}
    assert [r.last_step for r in detector._ranks] == [2, 1, 2]
    assert [r.link_rtt_s for r in detector._ranks] == [0.003, 0.002, None]


def test_step_columns_of_unequal_lengths_are_the_callers_error() -> None:
    from antdt.services.monitor import StepColumns

    detector = JobDetector(JOB, 2)
    columns = [[0, 1], ["h0", "h1"], [1, 1], [0, 0], [32, 32], [0.0] * 2, [0.1] * 2]
    columns += [[32, 32], [0.08] * 2, [0.0] * 2, [0.01] * 2, [0.1] * 2, [0.001]]
    with pytest.raises(ValueError, match="link_rtt_s"):
        detector.ingest_step(StepColumns(JOB, *columns), 1.0)  # type: ignore[arg-type]
    assert [r.last_step for r in detector._ranks] == [-1, -1]
