"""The policy simulator (antdt.sim): scenario files refused field by field, runs the
same for a seed, and the closed loop: plans and restarts feed back into step times."""

from __future__ import annotations

from pathlib import Path

import pytest

from antdt.sim.files import ScenarioError, load_scenario, parse_scenario
from antdt.sim.simulate import simulate

EXAMPLES = Path(__file__).parents[2] / "examples" / "sim"

STRAGGLER = """
name = "straggler"
seed = 1
ranks = 16
ranks_per_node = 4
steps = 400
restart_cost_s = 5.0
policies = ["none", "lb-bsp"]
[[slowdowns]]
ranks = [3]
start_step = 50
factor = 3.0
"""


def test_every_example_scenario_is_valid() -> None:
    files = sorted(EXAMPLES.glob("*.toml"))
    assert len(files) >= 5
    names = {load_scenario(f).name for f in files}
    assert len(names) == len(files)


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ('name = "x"\nranks = 8\nsteps = 10\nrankz = 3', "rankz", "Extra inputs"),
        ('name = "x"\nranks = 1\nsteps = 10', "ranks", "greater than or equal to 2"),
        ('name = "x"\nranks = 8\nsteps = 10\npolicies = ["fast"]', "policies", "unknown"),
        (
            'name = "x"\nranks = 8\nsteps = 10\n[[slowdowns]]\nfactor = 2.0',
            "slowdowns.0",
            "ranks or nodes",
        ),
        (
            'name = "x"\nranks = 8\nsteps = 10\n[contention]\nepisodes_per_rank = -1',
            "contention.episodes_per_rank",
            "greater than or equal to 0",
        ),
        ('name = "x"\nranks = 8\nsteps = ten', "(file)", "not TOML"),
    ],
)
def test_a_bad_field_is_refused_with_its_name_and_reason(
    text: str, field: str, reason: str
) -> None:
    with pytest.raises(ScenarioError) as refused:
        parse_scenario(text, "bad.toml")
    message = str(refused.value)
    assert message.startswith("bad.toml: ")
    assert reason in message
    if field != "(file)":
        assert f"{field}: " in message


def test_a_run_is_the_same_for_a_seed_and_differs_for_another(tmp_path: Path) -> None:
    path = EXAMPLES / "non_dedicated.toml"
    small = {"ranks": 16, "steps": 300, "policies": ("none", "antdt-nd")}
    first = simulate(load_scenario(path, **small)).figures
    assert simulate(load_scenario(path, **small)).figures == first
    other = simulate(load_scenario(path, **small, seed=99)).figures
    assert [f.job_s for f in other] != [f.job_s for f in first]


def test_a_plan_feeds_back_into_the_step_times() -> None:
    result = simulate(parse_scenario(STRAGGLER))
    by_policy = {f.policy: f for f in result.figures}
    none, lbbsp, oracle = by_policy["none"], by_policy["lb-bsp"], by_policy["oracle"]
    assert none.recovered == 0.0 and none.adjusts == 0
    assert lbbsp.adjusts >= 1
    assert lbbsp.recovered is not None and lbbsp.recovered > 0.6
    assert oracle.job_s <= lbbsp.job_s < none.job_s
    runs = {r.policy: r for r in result.runs}
    # After the plan, the job steps near the oracle's pace; without one, 3x the work.
    assert runs["lb-bsp"].step_s[-50:].mean() < 0.6 * runs["none"].step_s[-50:].mean()


def test_a_slow_link_is_moved_to_a_spare_for_the_restart_cost() -> None:
    scenario = load_scenario(
        EXAMPLES / "comm_straggler.toml", ranks=16, steps=800, policies=("none", "antdt-nd")
    )
    result = simulate(scenario)
    nd = next(r for r in result.runs if r.policy == "antdt-nd")
    none = next(r for r in result.runs if r.policy == "none")
    assert nd.restarts == 1 and nd.restart_s == scenario.restart_cost_s
    assert nd.job_s < none.job_s / 2


@pytest.mark.parametrize("name", ["node_slowdown.toml", "half_job_slowdown.toml"])
def test_ranks_slowing_together_do_not_fool_the_reference(name: str) -> None:
    """A node as a quarter of the job, two as half: the detector still holds them slow
    (its reference is the faster half's), and lb-bsp's plan recovers most of the loss."""
    scenario = load_scenario(EXAMPLES / name, steps=500, policies=("none", "lb-bsp"))
    lbbsp = next(f for f in simulate(scenario).figures if f.policy == "lb-bsp")
    assert lbbsp.recovered is not None and lbbsp.recovered > 0.6


def test_the_command_prints_the_figures_and_writes_json_and_png(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from antdt.cli.app import app

    scenario = tmp_path / "straggler.toml"
    scenario.write_text(STRAGGLER)
    result = CliRunner().invoke(
        app, ["sim", str(scenario), "--steps", "200", "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 0, result.output
    assert "lb-bsp" in result.output and "oracle" in result.output
    assert (tmp_path / "out" / "straggler.json").exists()
    assert (tmp_path / "out" / "straggler.png").exists()
    bad = CliRunner().invoke(app, ["sim", str(scenario), "--ranks", "1"])
    assert bad.exit_code == 2 and "ranks" in bad.output


def test_the_command_applies_zero_overrides_and_refuses_zero_ranks(tmp_path: Path) -> None:
    """`--seed 0` is a seed like any other, and `--ranks 0` is refused, not ignored."""
    import json

    from typer.testing import CliRunner

    from antdt.cli.app import app

    scenario = tmp_path / "straggler.toml"
    scenario.write_text(STRAGGLER)
    out = tmp_path / "out"
    args = ["sim", str(scenario), "--steps", "60", "-p", "none", "--jobs", "1", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--seed", "0"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "straggler.json").read_text())["scenario"]["seed"] == 0
    for field in ("--ranks", "--steps"):
        refused = CliRunner().invoke(app, [*args, field, "0"])
        assert refused.exit_code == 2 and field[2:] in refused.output


def test_a_run_pauses_the_cyclic_collector_and_restores_it() -> None:
    import gc

    from antdt.sim.run import fewer_collections

    assert gc.isenabled()
    with pytest.raises(RuntimeError), fewer_collections():
        assert not gc.isenabled()
        raise RuntimeError
    assert gc.isenabled()
    gc.disable()
    try:
        with fewer_collections():
            pass
        assert not gc.isenabled()  # as it was
    finally:
        gc.enable()


def test_none_runs_step_for_step_the_same_without_the_monitor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import numpy as np

    from antdt.services.controller.policies.none import NonePolicy
    from antdt.sim.run import run_policy

    scenario = load_scenario(EXAMPLES / "non_dedicated.toml", ranks=32, steps=300)
    skipped = run_policy(scenario, "none")
    monkeypatch.setattr(NonePolicy, "observes_only", False)
    watched = run_policy(scenario, "none")
    assert np.array_equal(skipped.step_s, watched.step_s)
    assert np.array_equal(skipped.compute_s, watched.compute_s)
    assert (skipped.adjusts, skipped.restarts) == (watched.adjusts, watched.restarts) == (0, 0)
