"""Per-job monitor params: the wire model, how they override a replica's defaults, how a
stored spec is read, and that a detector built from them behaves differently."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from antdt.agent.settings import AgentSettings
from antdt.schemas import IncidentKind, IncidentState, JobSpec, MonitorParams, RankState
from antdt.services.monitor import DetectorConfig, JobDetector
from antdt.services.monitor.jobconfig import job_config, read_spec
from tests.unit.test_detector import JOB, Job, opened, run, slow_rank


def spec(**monitor: object) -> JobSpec:
    return JobSpec(
        job=JOB,
        world_size=4,
        dataset_size=100,
        shard_size=10,
        global_batch=8,
        monitor=MonitorParams(**monitor) if monitor else None,  # type: ignore[arg-type]
    )


def detector_for(params: MonitorParams | None, world: int = 4) -> JobDetector:
    config, problem = job_config(DetectorConfig(), params)
    assert problem is None
    return JobDetector(JOB, world, config)


# ------------------------------------------------------------- the wire model


@pytest.mark.parametrize(
    "fields",
    [
        {"window": 1},
        {"slow_threshold": 0.0},
        {"slow_threshold": 1.0},
        {"persistent_windows": 0},
        {"stall_factor": -1.0},
        {"min_stall_s": float("nan")},
        {"slow_threshold": 0.4, "instant_threshold": 0.3},
        {"surprise": 1},
    ],
)
def test_params_out_of_range_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        MonitorParams.model_validate(fields)


def test_params_travel_in_the_spec_and_only_set_fields_override() -> None:
    stored = spec(window=16, slow_threshold=0.2).model_dump_json()
    again = JobSpec.model_validate_json(stored)
    assert again.monitor is not None
    assert again.monitor.overrides() == {"window": 16, "slow_threshold": 0.2}
    legacy = json.loads(stored)
    del legacy["monitor"]  # a spec stored before the field existed
    assert JobSpec.model_validate(legacy).monitor is None


# ----------------------------------------------------- replica defaults + job params


def test_job_params_override_the_replica_defaults_field_by_field() -> None:
    replica = DetectorConfig(window=12, slow_threshold=0.3, persistent_windows=4)
    config, problem = job_config(replica, MonitorParams(slow_threshold=0.2, leaders=False))
    assert problem is None
    assert (config.window, config.slow_threshold, config.persistent_windows) == (12, 0.2, 4)
    assert config.leaders is False
    assert job_config(replica, None) == (replica, None)
    assert job_config(replica, MonitorParams()) == (replica, None)


def test_a_mix_the_detector_refuses_falls_back_to_the_replica_defaults() -> None:
    replica = DetectorConfig(instant_threshold=0.5)
    config, problem = job_config(replica, MonitorParams(window=4, slow_threshold=0.6))
    assert config == replica  # not half applied: the window stays the replica's too
    assert problem is not None and "instant_threshold" in problem


def test_a_window_past_the_replicas_bound_over_the_job_falls_back_to_the_defaults() -> None:
    """A spec may not make the detector keep unbounded steps: window x world size."""
    replica = DetectorConfig(window=8)
    params = MonitorParams(window=10_000, slow_threshold=0.3)
    config, problem = job_config(replica, params, world_size=1000, max_window_rows=1_000_000)
    assert config == replica
    assert problem is not None and "10000 x 1000 ranks = 10000000 steps kept > 1000000" in problem
    fits, none = job_config(replica, params, world_size=100, max_window_rows=1_000_000)
    assert (fits.window, fits.slow_threshold, none) == (10_000, 0.3, None)
    # the bound is on what a job asks: the replica's own window stays whatever the size
    same, none = job_config(
        replica, MonitorParams(slow_threshold=0.3), world_size=10**6, max_window_rows=1000
    )
    assert (same.window, same.slow_threshold, none) == (8, 0.3, None)


def test_read_spec_keeps_a_spec_whose_monitor_section_is_unusable() -> None:
    good = spec(window=4)
    assert read_spec(good.model_dump_json().encode()) == (good, None)
    raw = json.loads(good.model_dump_json())
    for bad in ({"window": 0}, {"window": 4, "from_the_future": True}, "fast"):
        raw["monitor"] = bad
        kept, problem = read_spec(json.dumps(raw).encode())
        assert kept == spec()  # same job, no params: the replica's defaults apply
        assert problem is not None and "monitor" in problem


def test_read_spec_refuses_an_unreadable_spec() -> None:
    assert read_spec(b"not json") == (None, "spec is not JSON")
    broken = json.loads(spec(window=4).model_dump_json())
    broken["world_size"] = 0
    kept, problem = read_spec(json.dumps(broken).encode())
    assert kept is None and problem is not None and "world_size" in problem


def test_agent_sends_params_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "ANTDT_JOB": JOB,
        "ANTDT_DATASET_SIZE": "100",
        "ANTDT_SHARD_SIZE": "10",
        "ANTDT_GLOBAL_BATCH": "8",
        "ANTDT_MONITOR__WINDOW": "16",
        "ANTDT_MONITOR__SLOW_THRESHOLD": "0.2",
    }.items():
        monkeypatch.setenv(key, value)
    sent = AgentSettings(rank=0, world_size=2).job_spec().monitor
    assert sent == MonitorParams(window=16, slow_threshold=0.2)
    monkeypatch.setenv("ANTDT_MONITOR__WINDOW", "1")
    with pytest.raises(ValidationError, match="window"):
        AgentSettings(rank=0, world_size=2)


# ------------------------------------------- detectors built from per-job params


@pytest.mark.parametrize(("delta", "flagged"), [(0.2, True), (0.4, False)])
def test_slow_threshold_decides_whether_a_mild_straggler_is_flagged(
    delta: float, flagged: bool
) -> None:
    job = Job(4, cost=slow_rank(0, 1.3, start=40))
    detector, transitions = run(job, range(200), detector_for(MonitorParams(slow_threshold=delta)))
    if flagged:
        first = opened(transitions)[0]
        assert (first.rank, first.kind) == (0, IncidentKind.SLOW)
        assert first.ratio == pytest.approx(1.3)
    else:
        assert transitions == []
    # Either way the detector measured the same ratio: only the threshold differs.
    assert detector.health(1e9).ranks[0].ratio == pytest.approx(1.3)


def test_window_decides_when_ranks_are_first_measured() -> None:
    short, _ = run(Job(4), range(6), detector_for(MonitorParams(window=4)))
    default, _ = run(Job(4), range(6), detector_for(None))
    assert {r.state for r in short.health(1e9).ranks} == {RankState.OK}
    assert {r.state for r in default.health(1e9).ranks} == {RankState.UNKNOWN}


def test_persistent_windows_decides_when_a_straggler_escalates() -> None:
    job = Job(4, cost=slow_rank(2, 3.0, start=40))
    for k in (3, 6):
        _, transitions = run(job, range(200), detector_for(MonitorParams(persistent_windows=k)))
        states = [(i.state, i.windows) for i in transitions]
        assert states == [(IncidentState.OPENED, 1), (IncidentState.ESCALATED, k)]
