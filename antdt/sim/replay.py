"""What-if replay: a finished run's recorded steps replayed under other policies, closed
loop through the same cores as `antdt sim`. Pure (numpy); the CLI reads the steps.

Each recorded step, each rank's compute is split into the healthy rank's model at the
batch it ran (fixed_s + per_sample_s x samples: the recorded plan taken out) and a
factor, its speed at that step relative to that model; what the step took beyond its
slowest compute (exchange, barrier, data waits) is the step's overhead. A replayed
policy's plan meets the same factors and overheads step by step: compute = model at the
planned batch x factor, step = slowest compute + overhead. A rank moved to a spare node
runs at the median factor of its step from then on. Rules: docs/architecture.md, "What-if
replay"."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import ValidationError

from antdt.schemas import StepEvent
from antdt.sim.cluster import Floats
from antdt.sim.files import POLICY_NAMES, ScenarioFile, field_problems
from antdt.sim.run import Progress, RunResult, run_policy


class ReplayError(ValueError):
    """Steps that cannot be replayed (too few, not one job's, none complete, no speed
    measured), or overrides the scenario refuses."""


@dataclass(frozen=True)
class Recording:
    """A run's complete steps (every rank reported) as a steps x ranks table."""

    job: str
    step_index: tuple[int, ...]  # the recorded step numbers, in order
    samples: Floats  # steps x ranks, samples each rank processed
    compute: Floats  # steps x ranks, compute seconds
    wall: Floats  # per step: the ranks' median step time, seconds

    @property
    def ranks(self) -> int:
        return int(self.compute.shape[1])

    @property
    def global_batch(self) -> int:
        return round(float(np.median(self.samples.sum(axis=1))))


def recording(events: Sequence[StepEvent]) -> Recording:
    """The complete steps of one job's events; the latest event wins for a (step, rank)
    repeated (a restart from a checkpoint runs steps again). ReplayError when there are
    fewer than two ranks or two complete steps."""
    jobs = {e.job for e in events}
    if len(jobs) != 1:
        raise ReplayError(f"the steps must be one job's, got {len(jobs)} jobs")
    world = max(e.rank for e in events) + 1
    by_step: dict[int, dict[int, StepEvent]] = {}
    for event in events:
        by_step.setdefault(event.step, {})[event.rank] = event
    complete = sorted(s for s, ranks in by_step.items() if len(ranks) == world)
    if world < 2 or len(complete) < 2:
        raise ReplayError(f"{world} ranks and {len(complete)} complete steps: need 2 and 2")
    rows = [[by_step[s][r] for r in range(world)] for s in complete]
    samples = np.array([[e.samples for e in row] for row in rows], dtype=np.float64)
    compute = np.array([[e.compute_s for e in row] for row in rows], dtype=np.float64)
    wall = np.array([float(np.median([e.step_s for e in row])) for row in rows])
    return Recording(jobs.pop(), tuple(complete), samples, compute, wall)


@dataclass(frozen=True)
class HealthyModel:
    """The healthy rank's compute: fixed_s + per_sample_s x batch."""

    fixed_s: float
    per_sample_s: float


def healthy_model(rec: Recording) -> HealthyModel:
    """Fitted on the rank-steps at the faster half's per-sample cost: least squares of
    compute on samples where the batches vary enough to tell a fixed part, else the
    median per-sample cost with no fixed part. ReplayError when no rank-step has both
    samples and compute time."""
    used = (rec.samples > 0) & (rec.compute > 0)
    if not used.any():
        raise ReplayError("no rank-step computed samples in a measured time: no speed to fit")
    cost = np.where(used, rec.compute / np.maximum(rec.samples, 1.0), np.inf)
    fast = used & (cost <= np.median(cost[used]))
    x, y = rec.samples[fast], rec.compute[fast]
    if x.size >= 3 and float(np.std(x)) >= 0.05 * float(np.mean(x)):
        slope, intercept = np.polyfit(x, y, 1)
        if slope > 0 and intercept >= 0:
            return HealthyModel(float(intercept), float(slope))
    return HealthyModel(0.0, float(np.median(y / x)))


class RecordedCluster:
    """The recorded speeds as the simulator's cluster: `step(s)` gives every rank's
    compute factor and a link factor that scales `comm_s` to the step's overhead."""

    def __init__(self, rec: Recording, model: HealthyModel, comm_s: float) -> None:
        expected = model.fixed_s + model.per_sample_s * rec.samples
        self.factors = np.where(rec.samples > 0, rec.compute / np.maximum(expected, 1e-12), 1.0)
        self.overhead = np.maximum(0.0, rec.wall - rec.compute.max(axis=1))
        self.comm_s = comm_s
        self.moved_at = np.full(rec.ranks, -1, dtype=np.int64)

    def step(self, s: int) -> tuple[Floats, Floats]:
        factors = self.factors[s].copy()
        moved = (self.moved_at >= 0) & (self.moved_at <= s)
        if moved.any():
            factors[moved] = float(np.median(self.factors[s]))
        link = np.full(len(factors), self.overhead[s] / self.comm_s if self.comm_s else 0.0)
        return factors, link

    def move(self, rank: int, s: int) -> None:
        self.moved_at[rank] = s


def replay_scenario(
    rec: Recording, model: HealthyModel, policies: Sequence[str], **overrides: object
) -> ScenarioFile:
    """The scenario a replay runs: the recording's ranks, steps, batch and model, no
    noise (the recorded speeds have their own), the recorded overhead's median as comm_s."""
    overhead = np.maximum(0.0, rec.wall - rec.compute.max(axis=1))
    return ScenarioFile.model_validate(
        {
            "name": f"replay-{rec.job}"[:64],
            "description": f"the recorded steps of job {rec.job}",
            "ranks": rec.ranks,
            "ranks_per_node": 1,
            "steps": len(rec.step_index),
            "local_batch": max(1, round(rec.global_batch / rec.ranks)),
            "fixed_s": model.fixed_s,
            "per_sample_s": model.per_sample_s,
            "comm_s": float(np.median(overhead)) or float(np.mean(overhead)),
            "noise_cv": 0.0,
            "policies": tuple(policies),
            **overrides,
        }
    )


@dataclass(frozen=True)
class Replay:
    """The recorded run, measured, next to each policy's replay of it."""

    scenario: ScenarioFile
    measured_s: float  # the recorded steps' time
    healthy_s: float  # every rank at the healthy model, equal batches, same overheads
    runs: tuple[RunResult, ...]

    @property
    def measured_kept(self) -> float:
        return self.healthy_s / self.measured_s

    def kept(self, policy: str) -> float:
        """The throughput a policy's replay keeps: healthy time / its time."""
        run = next(r for r in self.runs if r.policy == policy)
        return self.healthy_s / run.job_s


def replay(
    events: Sequence[StepEvent],
    policies: Sequence[str],
    progress: dict[str, Progress] | None = None,
    **overrides: object,
) -> Replay:
    """Each of `policies` on the recorded run's speeds (ReplayError: unknown policy or
    steps that cannot be replayed); `overrides`: scenario fields (restart_cost_s, ...)."""
    unknown = [p for p in policies if p not in POLICY_NAMES]
    if unknown:
        raise ReplayError(f"unknown policies {unknown} (known: {list(POLICY_NAMES)})")
    rec = recording(events)
    model = healthy_model(rec)
    try:
        scenario = replay_scenario(rec, model, policies, **overrides)
    except ValidationError as exc:
        raise ReplayError(f"no valid scenario to replay: {field_problems(exc)}") from None
    runs = tuple(
        run_policy(
            scenario,
            name,
            (progress or {}).get(name),
            cluster=RecordedCluster(rec, model, scenario.comm_s),
        )
        for name in policies
    )
    return Replay(scenario, float(rec.wall.sum()), _healthy_s(rec, model, scenario), runs)


def _healthy_s(rec: Recording, model: HealthyModel, scenario: ScenarioFile) -> float:
    compute = model.fixed_s + model.per_sample_s * scenario.local_batch
    overhead = np.maximum(0.0, rec.wall - rec.compute.max(axis=1))
    return float((compute + overhead).sum())


__all__ = [
    "HealthyModel",
    "RecordedCluster",
    "Recording",
    "Replay",
    "ReplayError",
    "healthy_model",
    "recording",
    "replay",
    "replay_scenario",
]
