"""Labelled, seeded step traces of what real jobs show. Pure: no I/O, no clock.

Compute per step = (fixed_s + sample_s x batch) x the rank's speed x its slowdown x noise.
Noise is the shared-core kind (docs/detection.md): a few % of jitter, and in 10-25% of a
rank's steps, drawn independently, a neighbour takes the core (1.3-1.5x, the 30-50%
swings), rare spikes, a slow job-wide wave. Ranks live on hosts; a host can slow down.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from antdt.schemas import StepEvent
from antdt.sim.traces import RankClass, RankLabel, Trace, TraceSpec


@dataclass(frozen=True)
class Noise:
    """Shared-core noise; every rank draws its own jitter, hit share and speed."""

    base_cv: tuple[float, float] = (0.03, 0.08)  # jitter of every step (CV, log-uniform)
    hit_share: tuple[float, float] = (0.10, 0.25)  # share of steps a neighbour slows
    hit_factor: tuple[float, float] = (1.3, 1.5)  # how much a hit slows that step
    spike_share: float = 0.01  # single-step spikes (GC pause, page faults)
    spike_factor: tuple[float, float] = (1.5, 3.0)
    speed_spread: float = 0.03  # healthy ranks' speeds differ by up to this much
    drift: float = 0.1  # amplitude of a job-wide slow wave (all ranks at once)
    drift_steps: int = 500  # its period, steps


QUIET = Noise((0.0, 0.0), (0.0, 0.0), (1.0, 1.0), 0.0, (1.0, 1.0), 0.0, 0.0)


class Truth(str, enum.Enum):
    """What a rank is, for scoring: healthy, slow on its own, or slow with its host."""

    HEALTHY = "healthy"
    SLOW = "slow"
    HOST = "host"


@dataclass(frozen=True)
class ScenarioSpec:
    """What to generate. Slowdowns start at `onset_step` and last to the end."""

    world: int
    steps: int = 300
    seed: int = 0
    job: str = "scenario"
    ranks_per_host: int = 1
    batch: int = 32
    fixed_s: float = 0.0  # per-step compute that does not depend on the batch
    sample_s: float = 0.001  # per-sample compute of a healthy rank
    comm_s: float = 0.005
    data_s: float = 0.001
    slow_ranks: tuple[int, ...] = ()  # ranks slowed on their own
    slow_hosts: tuple[int, ...] = ()  # hosts (index) whose ranks all slow together
    factor: float = 1.4  # the slowdown
    onset_step: int = 100
    plans: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (from step, batch per rank)
    noise: Noise = field(default_factory=Noise)
    start_time: float = 1_000_000.0

    def __post_init__(self) -> None:
        if self.world < 1 or self.steps < 1 or self.ranks_per_host < 1 or self.batch < 1:
            raise ValueError("world, steps, ranks_per_host and batch must be >= 1")
        if any(not 0 <= r < self.world for r in self.slow_ranks):
            raise ValueError("slow_ranks must be ranks of the world")
        if any(not 0 <= h < self.hosts for h in self.slow_hosts):
            raise ValueError("slow_hosts must be hosts of the world")
        if any(len(batches) != self.world for _, batches in self.plans):
            raise ValueError("a plan must give every rank a batch")
        if [step for step, _ in self.plans] != sorted({step for step, _ in self.plans}):
            raise ValueError("plans must start at increasing steps")

    @property
    def hosts(self) -> int:
        return -(-self.world // self.ranks_per_host)

    def host_of(self, rank: int) -> str:
        return f"host{rank // self.ranks_per_host}"

    def truth(self, rank: int) -> Truth:
        if rank // self.ranks_per_host in self.slow_hosts:
            return Truth.HOST
        return Truth.SLOW if rank in self.slow_ranks else Truth.HEALTHY

    def plan_at(self, step: int) -> tuple[int, tuple[int, ...]]:
        """(plan version, local batches) in force at `step`; version 0: equal batches."""
        version, batches = 0, (self.batch,) * self.world
        for number, (start, planned) in enumerate(self.plans, start=1):
            if step >= start:
                version, batches = number, planned
        return version, batches


class StepRow(NamedTuple):
    """One step of every rank: what the detector's per-rank windows are made of."""

    step: int
    plan_version: int
    batches: tuple[int, ...]
    compute_s: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class _RankNoise:
    """One rank's noise, drawn once: jitter (log-uniform, mean 1), hits and spikes."""

    jitter_mu: float
    jitter_width: float
    hit_share: float
    hit_low: float
    hit_span: float
    spike_from: float  # a uniform draw at or above this is a spike
    spike_low: float
    spike_span: float
    speed: float  # healthy speed factor (1 +- speed_spread)

    @classmethod
    def draw(cls, noise: Noise, rng: random.Random) -> _RankNoise:
        cv = rng.uniform(*noise.base_cv)
        width = cv * math.sqrt(3.0)  # a log-uniform of this half-width has this CV (small)
        mu = -math.log(math.sinh(width) / width) if width > 0 else 0.0
        hit_share = rng.uniform(*noise.hit_share)
        speed = 1.0 + rng.uniform(-noise.speed_spread, noise.speed_spread)
        return cls(
            mu,
            width,
            hit_share,
            noise.hit_factor[0],
            noise.hit_factor[1] - noise.hit_factor[0],
            1.0 - noise.spike_share,
            noise.spike_factor[0],
            noise.spike_factor[1] - noise.spike_factor[0],
            speed,
        )

    def factor(self, jitter: float, event: float) -> float:
        """The step's noise from two uniform draws: `event` says whether a neighbour hit
        the step (its low end) or a spike did (its high end), and how hard."""
        value = math.exp(self.jitter_mu + self.jitter_width * (2.0 * jitter - 1.0))
        if event < self.hit_share:
            return value * (self.hit_low + self.hit_span * event / self.hit_share)
        if event >= self.spike_from:
            share = 1.0 - self.spike_from
            return value * (self.spike_low + self.spike_span * (event - self.spike_from) / share)
        return value


@dataclass(frozen=True)
class Scenario:
    """A job's steps as its spec says, with the truth about each rank."""

    spec: ScenarioSpec

    @property
    def truths(self) -> tuple[Truth, ...]:
        return tuple(self.spec.truth(r) for r in range(self.spec.world))

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(self.spec.host_of(r) for r in range(self.spec.world))

    def labels(self) -> tuple[RankLabel, ...]:
        """Ground truth in the trace generator's terms (persistent or deterministic)."""
        spec, labels = self.spec, []
        for rank, truth in enumerate(self.truths):
            if truth is Truth.HEALTHY:
                labels.append(RankLabel(rank, RankClass.HEALTHY, "none", None))
                continue
            klass = RankClass.DETERMINISTIC if spec.onset_step <= 0 else RankClass.PERSISTENT
            labels.append(RankLabel(rank, klass, "compute", spec.onset_step, None, spec.factor))
        return tuple(labels)

    def rows(self) -> Iterator[StepRow]:
        """Every step, in order; the same spec always gives the same rows."""
        spec, noise = self.spec, self.spec.noise
        rng = random.Random(spec.seed)
        ranks = [_RankNoise.draw(noise, rng) for _ in range(spec.world)]
        slowdown = [1.0 if t is Truth.HEALTHY else spec.factor for t in self.truths]
        uniform, scales, state = rng.random, [0.0] * spec.world, (-1, False)
        for step in range(spec.steps):
            version, batches = spec.plan_at(step)
            if state != (version, step >= spec.onset_step):
                state = (version, step >= spec.onset_step)
                scales = [
                    (spec.fixed_s + spec.sample_s * b) * r.speed * (s if state[1] else 1.0)
                    for r, b, s in zip(ranks, batches, slowdown, strict=True)
                ]
            wave = 1.0 + noise.drift * math.sin(2 * math.pi * step / max(noise.drift_steps, 1))
            compute = tuple(
                scale * wave * r.factor(uniform(), uniform())
                for scale, r in zip(scales, ranks, strict=True)
            )
            yield StepRow(step, version, batches, compute)

    def events(self) -> list[tuple[float, StepEvent]]:
        """(arrival time, StepEvent) in time order: all ranks meet at the all-reduce, so
        step_s is the slowest rank's compute + data wait, plus the communication."""
        spec = self.spec
        rng = random.Random(spec.seed + 1)  # its own stream: rows stay as they are
        hosts, events, t = self.hosts, [], spec.start_time
        for row in self.rows():
            data = [spec.data_s * math.exp(rng.gauss(0.0, 0.2)) for _ in row.compute_s]
            step_s = max(c + d for c, d in zip(row.compute_s, data, strict=True)) + spec.comm_s
            for rank, (c, d) in enumerate(zip(row.compute_s, data, strict=True)):
                event = StepEvent(
                    job=spec.job,
                    rank=rank,
                    host=hosts[rank],
                    step=row.step,
                    epoch=0,
                    plan_version=row.plan_version,
                    local_batch=row.batches[rank],
                    samples=row.batches[rank],
                    compute_s=c,
                    data_wait_s=d,
                    comm_s=max(0.0, step_s - c - d),
                    step_s=step_s,
                    started_at=t,
                    ended_at=t + step_s,
                )
                events.append((t + step_s + rng.uniform(0.0, 0.002), event))
            t += step_s
        events.sort(key=lambda item: item[0])
        return events

    def trace(self) -> Trace:
        """The scenario as a `Trace`, for the detector's replay harness."""
        spec = self.spec
        trace_spec = TraceSpec(
            world=spec.world,
            steps=spec.steps,
            seed=spec.seed,
            job=spec.job,
            batch=spec.batch,
            sample_s=spec.sample_s,
            comm_s=spec.comm_s,
            data_s=spec.data_s,
        )
        return Trace(trace_spec, self.labels(), self.events())


# ---------------------------------------------------------------------------- scenarios


def two_ranks(seed: int = 0, factor: float = 1.4, **overrides: object) -> Scenario:
    """Two ranks, one of them (drawn) `factor` slower from a drawn onset."""
    rng = random.Random(seed)
    slow, onset = (rng.randrange(2),), rng.randint(80, 160)
    return _scenario(
        {"world": 2, "seed": seed, "slow_ranks": slow, "factor": factor, "onset_step": onset},
        overrides,
    )


def half_job(world: int = 8, seed: int = 0, factor: float = 1.3, **overrides: object) -> Scenario:
    """One rank per host, half of them (drawn) slow together: the median moves with them."""
    rng = random.Random(seed)
    slow = tuple(sorted(rng.sample(range(world), world // 2)))
    onset = rng.randint(80, 160)
    return _scenario(
        {"world": world, "seed": seed, "slow_ranks": slow, "factor": factor, "onset_step": onset},
        overrides,
    )


def whole_host(
    world: int = 8,
    ranks_per_host: int = 4,
    seed: int = 0,
    factor: float = 1.3,
    **overrides: object,
) -> Scenario:
    """Ranks grouped by host; every rank of one host (drawn) slows down together."""
    rng = random.Random(seed)
    host, onset = (rng.randrange(-(-world // ranks_per_host)),), rng.randint(80, 160)
    fields = {"world": world, "seed": seed, "ranks_per_host": ranks_per_host}
    return _scenario(
        {**fields, "slow_hosts": host, "factor": factor, "onset_step": onset}, overrides
    )


def fixed_cost(
    world: int = 4, seed: int = 0, slow: bool = False, factor: float = 1.4, **overrides: object
) -> Scenario:
    """A fixed per-step cost as large as 32 samples' work, and a plan from step 160 that
    halves one rank's batch (as lb-bsp would): per sample, that rank now costs more.
    `slow`: it is also `factor` slower from step 100 (the straggler lb-bsp answered)."""
    rng = random.Random(seed)
    target = rng.randrange(world)
    batches = [32 + 16 // (world - 1)] * world if world > 1 else [32]
    batches[target] = 32 * world - sum(b for r, b in enumerate(batches) if r != target)
    fields = {"world": world, "seed": seed, "fixed_s": 0.032, "sample_s": 0.001, "steps": 400}
    return _scenario(
        {
            **fields,
            "slow_ranks": (target,) if slow else (),
            "factor": factor,
            "onset_step": 100,
            "plans": ((160, tuple(batches)),),
        },
        overrides,
    )


def healthy_job(world: int, steps: int = 10_000, seed: int = 0, **overrides: object) -> Scenario:
    """No straggler: the noise alone, for false-alarm checks."""
    return _scenario({"world": world, "steps": steps, "seed": seed}, overrides)


def _scenario(fields: dict[str, object], overrides: dict[str, object]) -> Scenario:
    """The scenario of `fields`, with any of them (or others of the spec) overridden."""
    return Scenario(ScenarioSpec(**{**fields, **overrides}))  # type: ignore[arg-type]


__all__ = [
    "QUIET",
    "Noise",
    "Scenario",
    "ScenarioSpec",
    "StepRow",
    "Truth",
    "fixed_cost",
    "half_job",
    "healthy_job",
    "two_ranks",
    "whole_host",
]
