"""Seeded, labelled StepEvent traces of a bulk-synchronous job (pure, no I/O, no clock): a
time-ordered list of `(arrival_time, StepEvent)` and every rank's ground truth, for the
detector's accuracy tests, the simulator and the benchmarks. The job model and the rank
classes: docs/architecture.md, "The trace generator". Imports only `antdt.schemas`."""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from antdt.schemas import StepEvent


class RankClass(str, enum.Enum):
    """How a rank behaves over a trace (its ground truth)."""

    HEALTHY = "healthy"  # jitter, rare spikes, optional blips too short for a window
    TRANSIENT = "transient"  # one burst of 2-5x for `transient_steps`, then healthy
    PERSISTENT = "persistent"  # healthy until its onset, then `persistent_factor` slower
    DETERMINISTIC = "deterministic"  # `deterministic_factor` slower from the start
    LEADER = "leader"  # `leader_factor` faster from the start
    DATA = "data"  # from its onset, waits `data_factor` x its compute for data each step
    DEAD = "dead"  # no step after its onset; the others are not slowed by it


@dataclass(frozen=True, slots=True)
class RankLabel:
    """Ground truth of one rank."""

    rank: int
    klass: RankClass
    cause: str  # "none", "compute", "data" or "stall"
    onset_step: int | None  # first abnormal step (None: never abnormal)
    end_step: int | None = None  # first normal step again (transient bursts only)
    factor: float = 1.0  # slowdown (or speed-up, < 1) of the abnormal steps


@dataclass(frozen=True)
class TraceSpec:
    """What to generate. `mix` names how many ranks of each class; the rest are healthy."""

    world: int
    steps: int = 200
    seed: int = 0
    mix: dict[RankClass, int] = field(default_factory=dict)
    job: str = "trace"
    batch: int = 32
    sample_s: float = 0.005  # per-sample compute cost of a healthy rank, seconds
    comm_s: float = 0.01  # pure communication per step, seconds
    data_s: float = 0.002  # healthy data wait per step, seconds
    cv_min: float = 0.10
    cv_max: float = 0.20
    spike_prob: float = 0.01
    blip_prob: float = 0.0  # chance a healthy rank gets one sub-window blip
    blip_steps: tuple[int, int] = (1, 3)
    onset_steps: tuple[int, int] = (40, 90)
    transient_steps: tuple[int, int] = (10, 15)
    burst_factor: tuple[float, float] = (2.0, 5.0)
    persistent_factor: tuple[float, float] = (1.8, 4.0)
    deterministic_factor: tuple[float, float] = (1.6, 3.0)
    leader_factor: tuple[float, float] = (0.4, 0.6)
    data_factor: tuple[float, float] = (2.0, 4.0)
    dead_steps: tuple[int, int] = (40, 100)
    start_time: float = 1_000_000.0

    def __post_init__(self) -> None:
        if self.world < 1 or self.steps < 1:
            raise ValueError("world and steps must be >= 1")
        if sum(self.mix.values()) > self.world:
            raise ValueError("the mix names more ranks than the world has")


@dataclass(frozen=True)
class Trace:
    spec: TraceSpec
    labels: tuple[RankLabel, ...]
    events: list[tuple[float, StepEvent]]  # (arrival time, event), in time order

    def label(self, rank: int) -> RankLabel:
        return self.labels[rank]


@dataclass(slots=True)
class _Behaviour:
    label: RankLabel
    cv: float
    blip: tuple[int, int, float] | None = None  # (start, stop, factor)

    def compute_factor(self, step: int) -> float:
        lab = self.label
        if lab.klass in (RankClass.DETERMINISTIC, RankClass.LEADER):
            return lab.factor
        if lab.klass is RankClass.PERSISTENT and lab.onset_step is not None:
            return lab.factor if step >= lab.onset_step else 1.0
        if lab.klass is RankClass.TRANSIENT and lab.onset_step is not None:
            assert lab.end_step is not None
            return lab.factor if lab.onset_step <= step < lab.end_step else 1.0
        if self.blip is not None and self.blip[0] <= step < self.blip[1]:
            return self.blip[2]
        return 1.0

    def data_factor(self, step: int) -> float:
        lab = self.label
        if lab.klass is RankClass.DATA and lab.onset_step is not None and step >= lab.onset_step:
            return lab.factor
        return 0.0

    def alive(self, step: int) -> bool:
        lab = self.label
        return lab.klass is not RankClass.DEAD or step < (lab.onset_step or 0)


def _labels(spec: TraceSpec, rng: random.Random) -> list[_Behaviour]:
    classes: list[RankClass] = []
    for klass, count in spec.mix.items():
        classes.extend([klass] * count)
    classes.extend([RankClass.HEALTHY] * (spec.world - len(classes)))
    rng.shuffle(classes)
    out = []
    for rank, klass in enumerate(classes):
        cv = rng.uniform(spec.cv_min, spec.cv_max)
        out.append(_Behaviour(_label(spec, rng, rank, klass), cv))
        if klass is RankClass.HEALTHY and rng.random() < spec.blip_prob:
            start = rng.randrange(spec.steps)
            out[-1].blip = (
                start,
                start + rng.randint(*spec.blip_steps),
                rng.uniform(*spec.burst_factor),
            )
    return out


def _label(spec: TraceSpec, rng: random.Random, rank: int, klass: RankClass) -> RankLabel:
    onset = rng.randint(*spec.onset_steps)
    if klass is RankClass.TRANSIENT:
        length = rng.randint(*spec.transient_steps)
        factor = rng.uniform(*spec.burst_factor)
        return RankLabel(rank, klass, "compute", onset, onset + length, factor)
    if klass is RankClass.PERSISTENT:
        return RankLabel(rank, klass, "compute", onset, None, rng.uniform(*spec.persistent_factor))
    if klass is RankClass.DETERMINISTIC:
        return RankLabel(rank, klass, "compute", 0, None, rng.uniform(*spec.deterministic_factor))
    if klass is RankClass.LEADER:
        return RankLabel(rank, klass, "compute", 0, None, rng.uniform(*spec.leader_factor))
    if klass is RankClass.DATA:
        return RankLabel(rank, klass, "data", onset, None, rng.uniform(*spec.data_factor))
    if klass is RankClass.DEAD:
        return RankLabel(rank, klass, "stall", rng.randint(*spec.dead_steps))
    return RankLabel(rank, klass, "none", None)


def generate(spec: TraceSpec) -> Trace:
    """The trace `spec` describes; the same spec always gives the same trace."""
    rng = random.Random(spec.seed)
    ranks = _labels(spec, rng)
    events: list[tuple[float, StepEvent]] = []
    t = spec.start_time
    for step in range(spec.steps):
        live = [b for b in ranks if b.alive(step)]
        if not live:
            break
        compute = [_compute(spec, b, step, rng) for b in live]
        data = [
            spec.data_s * math.exp(rng.gauss(0.0, 0.2)) + b.data_factor(step) * c
            for b, c in zip(live, compute, strict=True)
        ]
        busy = [c + d for c, d in zip(compute, data, strict=True)]
        step_s = max(busy) + spec.comm_s
        for b, c, d in zip(live, compute, data, strict=True):
            rank = b.label.rank
            # Arrival order within a step is shuffled a little by the network.
            arrival = t + step_s + rng.uniform(0.0, 0.002)
            events.append((arrival, _event(spec, rank, step, c, d, step_s, t)))
        t += step_s
    events.sort(key=lambda item: item[0])
    return Trace(spec, tuple(b.label for b in ranks), events)


def _compute(spec: TraceSpec, b: _Behaviour, step: int, rng: random.Random) -> float:
    sigma = math.sqrt(math.log1p(b.cv * b.cv))  # lognormal with this CV
    noise = math.exp(rng.gauss(-sigma * sigma / 2, sigma))
    if rng.random() < spec.spike_prob:
        noise *= rng.uniform(1.5, 3.0)
    return spec.sample_s * spec.batch * b.compute_factor(step) * noise


def _event(
    spec: TraceSpec, rank: int, step: int, compute: float, data: float, step_s: float, t: float
) -> StepEvent:
    return StepEvent(
        job=spec.job,
        rank=rank,
        host=f"h{rank}",
        step=step,
        epoch=0,
        plan_version=0,
        local_batch=spec.batch,
        samples=spec.batch,
        compute_s=compute,
        data_wait_s=data,
        comm_s=max(0.0, step_s - compute - data),
        step_s=step_s,
        started_at=t,
        ended_at=t + step_s,
    )


def healthy(world: int, steps: int, seed: int = 0, **overrides: object) -> TraceSpec:
    """A healthy job: jitter and spikes only."""
    return TraceSpec(world=world, steps=steps, seed=seed, **overrides)  # type: ignore[arg-type]


def mixed(
    world: int, seed: int = 0, per_class: int | None = None, **overrides: object
) -> TraceSpec:
    """Every abnormal class present: `per_class` ranks each (default: 1 per 16 ranks)."""
    n = per_class if per_class is not None else max(1, world // 16)
    abnormal: Sequence[RankClass] = [c for c in RankClass if c is not RankClass.HEALTHY]
    return TraceSpec(
        world=world,
        seed=seed,
        mix={c: n for c in abnormal},
        **overrides,  # type: ignore[arg-type]
    )


__all__ = ["RankClass", "RankLabel", "Trace", "TraceSpec", "generate", "healthy", "mixed"]
