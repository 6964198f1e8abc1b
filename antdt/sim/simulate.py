"""One simulation: the scenario's policies, `none`, the oracle and the healthy cluster,
each from the same draws, with a progress callback. The facade the CLI and the bench use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from antdt.sim.files import ScenarioFile
from antdt.sim.report import Figures, figures
from antdt.sim.run import RunResult, run_policy, run_reference
from antdt.sim.workers import REFERENCE, Tick, run_in_workers


@dataclass(frozen=True)
class Simulation:
    scenario: ScenarioFile
    runs: tuple[RunResult, ...]  # `none` first, then the scenario's other policies
    oracle: RunResult
    healthy: RunResult

    @property
    def figures(self) -> list[Figures]:
        return figures(self.runs, self.oracle, self.healthy)


def run_names(scenario: ScenarioFile) -> list[str]:
    """The runs of a simulation, in order: the reference, `none` (always), the others."""
    return [REFERENCE, "none", *(p for p in scenario.policies if p != "none")]


def simulate(scenario: ScenarioFile, tick: Tick | None = None, *, workers: int = 1) -> Simulation:
    """Every policy of the scenario (and `none`, always) in closed loop; with `workers`
    above 1, the runs side by side in that many processes (workers.py): the same
    figures, in about the time of the longest run."""
    reference, *names = run_names(scenario)
    if workers > 1:
        (oracle, healthy), ran = run_in_workers(scenario, names, workers, tick)
        return Simulation(scenario, tuple(ran), oracle, healthy)

    def progress(what: str) -> Callable[[int], None] | None:
        return None if tick is None else (lambda done: tick(what, done))

    oracle, healthy = run_reference(scenario, progress(reference))
    runs = tuple(run_policy(scenario, name, progress(name)) for name in names)
    return Simulation(scenario, runs, oracle, healthy)
