"""What-if replay (`antdt sim --from-steps` / `--from-job`): a real run's recorded steps
replayed under its own policy predict what was measured. The fixtures are the step
events JetStream recorded in a real `antdt demo --steps 96` (4 ranks training on CPU,
rank 3 slowed 3x by busy loops in its CPU budget from step 30; policy `none`, then
`lb-bsp`), written by the demo itself (tests/fixtures/replay/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from antdt.schemas import StepEvent
from antdt.sim.recording import load_steps, save_steps
from antdt.sim.replay import RecordedCluster, ReplayError, healthy_model, recording, replay

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "replay"
RUNS = {"none": "demo-none.steps.jsonl.gz", "lb-bsp": "demo-lbbsp.steps.jsonl.gz"}
ONSET = 30  # the demo's: rank 3 slows from this step


def _steps(policy: str) -> list[StepEvent]:
    return load_steps(FIXTURES / RUNS[policy])


def _after_over_before(step_index: tuple[int, ...], walls: np.ndarray) -> float:
    """Throughput after the onset over before it (the first steps warm up)."""
    index = np.array(step_index)
    before = walls[(index >= 5) & (index < ONSET)].mean()
    return float(before / walls[index >= ONSET].mean())


@pytest.mark.parametrize("policy", ["none", "lb-bsp"])
def test_replay_under_the_runs_own_policy_predicts_its_throughput_kept(policy: str) -> None:
    """Within 10% of the recorded run: throughput kept against the healthy cluster, and
    the share of its throughput the run kept after the onset."""
    events = _steps(policy)
    result = replay(events, [policy])
    predicted, measured = result.kept(policy), result.measured_kept
    assert predicted == pytest.approx(measured, rel=0.10), (predicted, measured)
    run, rec = result.runs[0], recording(events)
    kept_after = _after_over_before(rec.step_index, run.step_s)
    measured_after = _after_over_before(rec.step_index, rec.wall)
    assert kept_after == pytest.approx(measured_after, rel=0.10), (kept_after, measured_after)
    assert measured < 0.8  # the slowdown was real: there was something to predict


def test_the_replayed_lb_bsp_acts_and_beats_none_on_the_same_steps() -> None:
    result = replay(_steps("none"), ["none", "lb-bsp"])
    none, lbbsp = result.runs
    assert none.adjusts == 0 and lbbsp.adjusts >= 1
    assert result.kept("lb-bsp") > result.kept("none") * 1.05


@pytest.mark.parametrize("policy", ["none", "lb-bsp"])
def test_the_speeds_taken_from_the_steps_show_the_staged_slowdown(policy: str) -> None:
    """Compute over the healthy model at each recorded batch: rank 3 about 3x the others
    after the onset, whatever batch the plan gave it. Batches that varied (lb-bsp's
    plan) let the model tell a fixed part; equal ones do not."""
    rec = recording(_steps(policy))
    model = healthy_model(rec)
    assert (model.fixed_s > 0) == (policy == "lb-bsp") and model.per_sample_s > 0
    factor = RecordedCluster(rec, model, comm_s=1.0).factors  # what a replay meets
    after = np.array(rec.step_index) >= ONSET + 5
    ratio = np.median(factor[after, 3]) / np.median(factor[after, :3])
    assert 2.0 < ratio < 4.0, ratio


def test_a_replay_is_deterministic() -> None:
    events = _steps("lb-bsp")
    first, again = replay(events, ["lb-bsp"]), replay(events, ["lb-bsp"])
    assert np.array_equal(first.runs[0].step_s, again.runs[0].step_s)


def test_steps_that_cannot_be_replayed_are_refused() -> None:
    events = _steps("none")
    other = [e.model_copy(update={"job": "other"}) for e in events[:8]]
    with pytest.raises(ReplayError, match="one job's"):
        replay([*events, *other], ["none"])
    with pytest.raises(ReplayError, match="complete steps"):
        replay([e for e in events if e.step == 0], ["none"])
    with pytest.raises(ReplayError, match="unknown policies"):
        replay(events, ["fastest"])


def test_steps_with_no_measured_speed_are_refused_not_fitted() -> None:
    events = _steps("none")
    for update in ({"compute_s": 0.0}, {"samples": 0}):
        unmeasured = [e.model_copy(update=update) for e in events]
        with pytest.raises(ReplayError, match="no speed to fit"):
            replay(unmeasured, ["none"])


def test_overrides_the_scenario_refuses_are_a_replay_error() -> None:
    with pytest.raises(
        ReplayError, match="no valid scenario to replay: restart_cost_s: Input should be greater"
    ):
        replay(_steps("none"), ["none"], restart_cost_s=-1.0)


def test_a_step_run_again_after_a_restart_counts_once() -> None:
    """The latest event of a (step, rank) wins: a restart from a checkpoint reruns steps."""
    events = _steps("none")
    again = [e.model_copy(update={"compute_s": e.compute_s * 2}) for e in events if e.step == 5]
    rec = recording([*events, *again])
    by_rank = {e.rank: e.compute_s for e in again}
    assert rec.compute[rec.step_index.index(5)].tolist() == [by_rank[r] for r in range(4)]
    assert len(rec.step_index) == len(recording(events).step_index)


def test_steps_files_round_trip_and_name_a_bad_line(tmp_path: Path) -> None:
    events = _steps("none")[:12]
    for name in ("steps.jsonl", "steps.jsonl.gz"):
        assert load_steps(save_steps(tmp_path / name, events)) == events
    bad = tmp_path / "bad.jsonl"
    bad.write_text(events[0].model_dump_json() + "\n{}\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not a step event"):
        load_steps(bad)


def test_a_cut_or_corrupt_gzip_steps_file_is_a_value_error(tmp_path: Path) -> None:
    whole = save_steps(tmp_path / "whole.jsonl.gz", _steps("none")[:40]).read_bytes()
    cut, corrupt = tmp_path / "cut.jsonl.gz", tmp_path / "corrupt.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    corrupt.write_bytes(whole[:20] + bytes(b ^ 0xFF for b in whole[20:60]) + whole[60:])
    with pytest.raises(ValueError, match=r"cut\.jsonl\.gz: unreadable .*EOFError"):
        load_steps(cut)
    with pytest.raises(ValueError, match=r"corrupt\.jsonl\.gz: unreadable .*error"):
        load_steps(corrupt)


def test_the_command_replays_a_steps_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from antdt.cli.app import app

    steps = str(FIXTURES / RUNS["lb-bsp"])
    result = CliRunner().invoke(
        app, ["sim", "--from-steps", steps, "-p", "lb-bsp", "-p", "none", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "recorded" in result.output and "replay lb-bsp" in result.output
    body = json.loads(next(tmp_path.glob("replay-*.json")).read_text())
    assert [r["policy"] for r in body["replays"]] == ["lb-bsp", "none"]
    missing = CliRunner().invoke(app, ["sim", "--from-steps", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2
    neither = CliRunner().invoke(app, ["sim"])
    assert neither.exit_code == 2
