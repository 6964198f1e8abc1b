"""A simulation's runs side by side in worker processes. Each run (the reference, each
policy) depends on the scenario alone (its draws come from the scenario's seed), so the
runs can take one core each and come back with the figures they have one after another
in one process. Their progress comes back over a queue, TICKS_PER_RUN reports a run."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from typing import Any

from antdt.sim.files import ScenarioFile
from antdt.sim.run import RunResult, run_policy, run_reference

#: The reference's name among the runs (the oracle with the healthy cluster).
REFERENCE = "oracle"
#: Rank-steps of a scenario from which `antdt sim` runs in workers by default: a worker
#: first imports numpy, pydantic and the cores (about a second), more than a small
#: scenario's whole run.
PARALLEL_FROM = 1_000_000
#: (run, steps done in it); called after a run's steps (in workers: as they report).
Tick = Callable[[str, int], None]
#: Progress reports a run sends at most (and its last step's).
TICKS_PER_RUN = 200

_reports: Any = None  # the worker's end of the progress queue (set by `_started`)


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the OS tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def tick_every(steps: int) -> int:
    """Steps between two progress reports of a run of `steps` steps."""
    return max(1, steps // TICKS_PER_RUN)


def default_workers(scenario: ScenarioFile, runs: int) -> int:
    """Workers for `runs` runs of `scenario`: one per usable core up to the runs from
    PARALLEL_FROM rank-steps on, else 1 (everything in this process)."""
    if scenario.ranks * scenario.steps < PARALLEL_FROM:
        return 1
    return max(1, min(runs, usable_cores()))


def run_in_workers(
    scenario: ScenarioFile, policies: Sequence[str], workers: int, tick: Tick | None = None
) -> tuple[tuple[RunResult, RunResult], list[RunResult]]:
    """The reference and each policy's run of `scenario` in a pool of `workers`
    processes (spawned: nothing of this process's state goes with them), reported to
    `tick` as REFERENCE and the policy's name. A run's error is raised here once the
    runs already going have ended, the runs not started cancelled."""
    context = multiprocessing.get_context("spawn")
    # A SimpleQueue writes each report before the worker goes on, so a run's last one
    # is in the pipe before its result: a Queue's feeder thread could send it after.
    reports = context.SimpleQueue()
    every = tick_every(scenario.steps)
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_started, initargs=(reports,)
    ) as pool:
        reference = pool.submit(_reference, scenario, every)
        runs = [pool.submit(_policy, scenario, name, every) for name in policies]
        try:
            _follow([reference, *runs], reports, tick)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return reference.result(), [run.result() for run in runs]


def _follow(futures: Sequence[Future[Any]], reports: Any, tick: Tick | None) -> None:
    """Pass the workers' progress on to `tick` until every run has ended; the first
    run's error raised."""
    pending: set[Future[Any]] = set(futures)
    while pending:
        done, pending = wait(pending, timeout=0.1, return_when=FIRST_EXCEPTION)
        _drain(reports, tick)
        for future in done:
            future.result()
    _drain(reports, tick)


def _drain(reports: Any, tick: Tick | None) -> None:
    while not reports.empty():
        name, done = reports.get()
        if tick is not None:
            tick(name, done)


def _started(reports: Any) -> None:
    global _reports
    _reports = reports


def _reporter(name: str, steps: int, every: int) -> Callable[[int], None]:
    """A run's progress callback in a worker: every `every` steps and its last."""

    def report(done: int) -> None:
        if _reports is not None and (done % every == 0 or done == steps):
            _reports.put((name, done))

    return report


def _reference(scenario: ScenarioFile, every: int) -> tuple[RunResult, RunResult]:
    return run_reference(scenario, _reporter(REFERENCE, scenario.steps, every))


def _policy(scenario: ScenarioFile, name: str, every: int) -> RunResult:
    return run_policy(scenario, name, _reporter(name, scenario.steps, every))


__all__ = [
    "PARALLEL_FROM",
    "REFERENCE",
    "TICKS_PER_RUN",
    "Tick",
    "default_workers",
    "run_in_workers",
    "tick_every",
    "usable_cores",
]
