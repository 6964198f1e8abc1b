"""A simulation's runs in worker processes: the figures of the same runs in one
process, every run's progress reported up to its last step."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from antdt.sim.files import load_scenario
from antdt.sim.simulate import run_names, simulate
from antdt.sim.workers import PARALLEL_FROM, default_workers, usable_cores

SCENARIO = Path(__file__).parents[2] / "examples" / "sim" / "non_dedicated.toml"


def test_runs_in_workers_give_the_figures_and_steps_of_runs_in_one_process() -> None:
    scenario = load_scenario(SCENARIO, ranks=16, steps=200, policies=("lb-bsp", "antdt-nd"))
    reached: dict[str, list[int]] = {}

    def tick(what: str, done: int) -> None:
        reached.setdefault(what, []).append(done)

    alone = simulate(scenario)
    side_by_side = simulate(scenario, tick, workers=2)

    assert side_by_side.figures == alone.figures
    for ran, expected in zip(side_by_side.runs, alone.runs, strict=True):
        assert ran.policy == expected.policy
        np.testing.assert_array_equal(ran.step_s, expected.step_s)
    assert sorted(reached) == sorted(run_names(scenario))
    for done in reached.values():
        assert done == sorted(done)
        assert done[-1] == 200


def test_a_small_scenario_runs_in_this_process_a_large_one_on_the_cores() -> None:
    small = load_scenario(SCENARIO, ranks=256, steps=1000)
    large = load_scenario(SCENARIO, ranks=10_000, steps=1000)
    assert small.ranks * small.steps < PARALLEL_FROM <= large.ranks * large.steps
    assert default_workers(small, 5) == 1
    assert default_workers(large, 5) == min(5, usable_cores())
    assert default_workers(large, 1) == 1


def test_the_command_in_two_workers_writes_the_figures_of_one_process(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from antdt.cli.app import app

    written = {}
    for jobs in ("1", "2"):
        out = tmp_path / jobs
        args = ["sim", str(SCENARIO), "--ranks", "16", "--steps", "150", "-j", jobs]
        result = CliRunner().invoke(app, [*args, "--out", str(out)])
        assert result.exit_code == 0, result.output
        written[jobs] = json.loads((out / "non-dedicated.json").read_text())
    assert written["2"] == written["1"]
    assert {row["policy"] for row in written["2"]["figures"]} >= {"none", "oracle", "antdt-nd"}
