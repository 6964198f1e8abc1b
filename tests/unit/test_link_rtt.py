"""A rank's slow link (its round trip to nats-server, `StepEvent.link_rtt_s`) while its
compute is normal: the detector's communication rule, with golden figures. In a ring
all-reduce every rank's exchange slows alike, so only the round trip says whose link."""

from __future__ import annotations

import json

import pytest

from antdt.schemas import Cause, Incident, IncidentState, MonitorParams, StepEvent
from antdt.services.monitor import DetectorConfig, JobDetector
from antdt.services.monitor.jobconfig import job_config

JOB = "job1"
W = DetectorConfig().window
FAST_RTT = 0.001  # a healthy link's round trip, seconds


def event(rank: int, step: int, *, compute_s: float, step_s: float, rtt: float | None):
    """Rank `rank`'s step: 32 samples, `compute_s` of compute, the rest exchange."""
    t = 1000.0 + step
    return StepEvent(
        job=JOB,
        rank=rank,
        host=f"h{rank}",
        step=step,
        epoch=0,
        plan_version=0,
        local_batch=32,
        samples=32,
        compute_s=compute_s,
        data_wait_s=0.0,
        comm_s=step_s - compute_s,
        step_s=step_s,
        started_at=t,
        ended_at=t + step_s,
        link_rtt_s=rtt,
    )


def run(
    world: int,
    steps: int,
    rtt: dict[int, float],
    *,
    onset: int = 40,
    slow_comm_s: float = 0.050,
    config: DetectorConfig | None = None,
    compute: dict[int, float] | None = None,
    until: int | None = None,
) -> tuple[JobDetector, list[Incident]]:
    """`world` ranks, all at FAST_RTT; from `onset` (to `until`) the ranks of `rtt` have
    that round trip and every rank's exchange takes `slow_comm_s` (2 ms before)."""
    detector = JobDetector(JOB, world, config)
    transitions = []
    for step in range(steps):
        slowed = onset <= step and (until is None or step < until)
        work = [(compute or {}).get(r, 0.032) if slowed else 0.032 for r in range(world)]
        step_s = max(work) + (slow_comm_s if slowed and rtt else 0.002)  # bulk-synchronous
        for rank in range(world):
            link = rtt.get(rank, FAST_RTT) if slowed else FAST_RTT
            ev = event(rank, step, compute_s=work[rank], step_s=step_s, rtt=link)
            transitions.extend(detector.ingest(ev, 1000.0 + step))
    return detector, transitions


def test_a_slow_link_opens_a_communication_incident_with_its_figures() -> None:
    _, transitions = run(4, 80, {2: 0.080})
    assert [(i.rank, i.state, i.cause, i.step) for i in transitions] == [
        (2, IncidentState.OPENED, Cause.COMMUNICATION, 63),
        (2, IncidentState.ESCALATED, Cause.COMMUNICATION, 63),  # K = 3 windows: persistent
    ]
    opened = transitions[0]
    # The windows closing at steps 47, 55 and 63 judged it: three in a row open.
    assert opened.windows == 3
    assert opened.ratio == pytest.approx(1.0)
    assert opened.evidence["link_rtt_s"] == pytest.approx(0.080)
    assert opened.evidence["others_link_rtt_s"] == pytest.approx(FAST_RTT)
    assert opened.evidence["step_s"] == pytest.approx(0.082)
    assert opened.evidence["step_s_before"] == pytest.approx(0.034)


def test_a_link_slow_for_good_turns_persistent_and_resolves_when_it_heals() -> None:
    _, transitions = run(4, 160, {1: 0.2}, until=120)
    assert [(i.rank, i.state) for i in transitions] == [
        (1, IncidentState.OPENED),
        (1, IncidentState.ESCALATED),
        (1, IncidentState.RESOLVED),
    ]
    assert {i.cause for i in transitions} == {Cause.COMMUNICATION}
    assert transitions[1].evidence["step_s_before"] == pytest.approx(0.034)


@pytest.mark.parametrize(
    ("rtt", "slow"),
    [
        (0.020, False),  # under the others' 1 ms + the 20 ms floor
        (0.022, True),  # over it (and over 3 x 1 ms)
    ],
)
def test_the_floor_keeps_small_round_trips_quiet(rtt: float, slow: bool) -> None:
    _, transitions = run(4, 80, {3: rtt})
    assert bool(transitions) is slow
    assert all((i.rank, i.cause) == (3, Cause.COMMUNICATION) for i in transitions)


@pytest.mark.parametrize(("rtt", "slow"), [(0.055, False), (0.065, True)])
def test_over_a_slow_control_plane_the_factor_decides(rtt: float, slow: bool) -> None:
    # Every link at 20 ms: 3 x 20 ms (60 ms) is the higher bar, not 20 + 20 ms.
    detector = JobDetector(JOB, 4)
    transitions = []
    for step in range(80):
        for rank in range(4):
            link = rtt if rank == 0 and step >= 40 else 0.020
            ev = event(rank, step, compute_s=0.032, step_s=0.042, rtt=link)
            transitions.extend(detector.ingest(ev, 1000.0 + step))
    assert bool(transitions) is slow


def test_every_link_slowed_alike_is_no_straggler() -> None:
    _, transitions = run(4, 120, {r: 0.080 for r in range(4)})
    assert transitions == []


def test_a_rank_slow_in_compute_is_a_compute_straggler_whatever_its_link() -> None:
    _, transitions = run(4, 80, {2: 0.080}, compute={2: 0.064})
    assert {(i.rank, i.cause) for i in transitions} == {(2, Cause.COMPUTE)}


def test_a_rank_with_no_measure_and_ranks_without_the_field_are_judged_as_before() -> None:
    # Agents of an earlier version send no round trip: nothing to compare, no incident.
    detector = JobDetector(JOB, 3)
    for step in range(80):
        for rank in range(3):
            rtt = 0.5 if rank == 0 else None
            ev = event(rank, step, compute_s=0.032, step_s=0.082, rtt=rtt)
            assert detector.ingest(ev, 1000.0 + step) == []
    fields = (JOB, 0, "h0", 80, 0, 32, 1080.0, 1080.1, 32, 0.032, 0.0, 0.05, 0.082)
    assert detector.ingest_fields(fields, 1080.1) == []  # type: ignore[arg-type]


def test_the_round_trip_is_off_the_wire_until_measured() -> None:
    unmeasured = json.loads(event(0, 1, compute_s=0.032, step_s=0.034, rtt=None).model_dump_json())
    measured = json.loads(event(0, 1, compute_s=0.032, step_s=0.034, rtt=0.0042).model_dump_json())
    assert "link_rtt_s" not in unmeasured
    assert measured["link_rtt_s"] == 0.0042
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        event(0, 1, compute_s=0.032, step_s=0.034, rtt=-0.001)


def test_a_job_sets_its_own_link_thresholds_and_bad_ones_are_refused() -> None:
    params = MonitorParams(link_rtt_factor=5.0, link_rtt_floor_s=0.1)
    config, error = job_config(DetectorConfig(), params)
    assert error is None
    assert (config.link_rtt_factor, config.link_rtt_floor_s) == (5.0, 0.1)
    _, transitions = run(4, 80, {2: 0.080}, config=config)
    assert transitions == []  # 80 ms is under 1 ms + 100 ms
    with pytest.raises(ValueError, match="link_rtt_factor"):
        DetectorConfig(link_rtt_factor=0.5)
    assert "link_rtt_factor" not in MonitorParams().model_dump_json()
