"""The real-contention row's figures, from what one run recorded: rank 0's progress
(one record per step: step, t, samples), every rank's step events and the applied
actions. Pure: the runner (bench.contention) measures, this judges."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from antdt.demo.stats import throughput
from antdt.schemas import ActionRecord, ActionResult, StepEvent

#: The least the neighbour must slow its rank against the other for a run to count (per
#: sample, after onset over before): 1.4-1.8x here, in the foreground of the machine.
MIN_SLOWDOWN = 1.3
#: The issue's target: lb-bsp's throughput after onset over that of policy none.
TARGET_RATIO = 1.2


class NeighbourTooWeak(RuntimeError):
    """The noisy neighbour did not slow its rank: the run measured no contention."""


@dataclass(frozen=True)
class Window:
    """Steps of one run: warm-up ends, the neighbour starts, the plan has settled."""

    warmup: int
    onset: int
    settle: int

    @property
    def settled(self) -> int:
        return self.onset + self.settle


@dataclass(frozen=True)
class Plan:
    """A plan the ranks ran: its version, its batches by rank, its first step."""

    version: int
    batches: tuple[int, ...]
    first_step: int


@dataclass(frozen=True)
class RunFigures:
    policy: str
    job: str
    onset: int
    steps: int
    before_samples_per_s: float
    after_samples_per_s: float  # from onset + settle to the end
    after_all_samples_per_s: float  # from onset to the end
    slowdown: float  # the straggler's per-sample compute over the other's, after onset / before
    speeds_after: tuple[float, ...]  # per rank, samples per compute second, once settled
    overhead_s: float  # per step, once settled: wall time less the slowest rank's compute
    plans: tuple[Plan, ...]
    actions: tuple[str, ...]  # applied actions' reasons

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def per_sample_s(events: list[StepEvent], rank: int, first: int, last: int) -> float:
    """Median compute seconds per sample of `rank` over steps [first, last)."""
    costs = [
        e.compute_s / e.samples
        for e in events
        if e.rank == rank and first <= e.step < last and e.samples > 0
    ]
    if not costs:
        raise ValueError(f"rank {rank} has no step events in [{first}, {last})")
    return statistics.median(costs)


def relative_cost(events: list[StepEvent], straggler: int, steps: tuple[int, int]) -> float:
    """The straggler's per-sample compute time over the other ranks' (their median), over
    `steps` [first, last): what load on both cores alike does not move."""
    others = [r for r in {e.rank for e in events} if r != straggler]
    return per_sample_s(events, straggler, *steps) / statistics.median(
        per_sample_s(events, r, *steps) for r in others
    )


def check_contention(figures: RunFigures, straggler: int) -> None:
    """Raise NeighbourTooWeak unless the neighbour slowed its rank by MIN_SLOWDOWN."""
    if figures.slowdown < MIN_SLOWDOWN:
        raise NeighbourTooWeak(
            f"{figures.policy} run: the noisy neighbour slowed rank {straggler} by "
            f"x{figures.slowdown:.2f} only against the other rank (per-sample compute, after "
            f"onset over before; x{MIN_SLOWDOWN} needed): these figures would measure no "
            "contention (outside the foreground, without CAP_SYS_NICE, a busy machine moves "
            "its other work onto the other rank's core)"
        )


def plans_run(events: list[StepEvent], world: int) -> tuple[Plan, ...]:
    """The plans the ranks ran, in order, from what every rank asked for at each step."""
    batches: dict[int, dict[int, int]] = defaultdict(dict)
    versions: dict[int, int] = {}
    for e in events:
        batches[e.step][e.rank] = e.local_batch
        versions[e.step] = max(versions.get(e.step, 0), e.plan_version)
    plans: list[Plan] = []
    for step in sorted(batches):
        ranks = batches[step]
        if len(ranks) < world:
            continue
        plan = Plan(versions[step], tuple(ranks[r] for r in range(world)), step)
        if not plans or (plan.version, plan.batches) != (plans[-1].version, plans[-1].batches):
            plans.append(plan)
    return tuple(plans)


def overhead_s(progress: list[dict[str, Any]], events: list[StepEvent], first: int) -> float:
    """Median per step from `first` on: rank 0's wall time between step ends, less the
    slowest rank's compute (the exchange, the optimizer, the agent: what balancing keeps)."""
    ends = {p["step"]: p["t"] for p in progress}
    slowest: dict[int, float] = defaultdict(float)
    for e in events:
        slowest[e.step] = max(slowest[e.step], e.compute_s)
    spans = [
        ends[s] - ends[s - 1] - slowest[s]
        for s in sorted(ends)
        if s > first and s - 1 in ends and s in slowest
    ]
    return max(0.0, statistics.median(spans)) if spans else 0.0


def run_figures(
    *,
    policy: str,
    job: str,
    progress: list[dict[str, Any]],
    events: list[StepEvent],
    actions: list[ActionRecord],
    window: Window,
    world: int,
    straggler: int,
) -> RunFigures:
    """One run's figures (check_contention says whether they measured contention)."""
    end = progress[-1]["step"]
    onset, settled = window.onset, window.settled
    if end <= settled + 2:
        raise ValueError(f"the run ended at step {end}, before onset + settle ({settled})")
    plans = plans_run(events, world)
    replan = min((p.first_step for p in plans[1:] if p.first_step > onset + 3), default=settled)
    slowdown = relative_cost(events, straggler, (onset + 1, min(replan, settled))) / (
        relative_cost(events, straggler, (window.warmup, onset))
    )
    return RunFigures(
        policy=policy,
        job=job,
        onset=onset,
        steps=len(progress),
        before_samples_per_s=round(throughput(progress, window.warmup, onset - 1), 1),
        after_samples_per_s=round(throughput(progress, settled, end), 1),
        after_all_samples_per_s=round(throughput(progress, onset, end), 1),
        slowdown=round(slowdown, 3),
        speeds_after=tuple(
            round(1.0 / per_sample_s(events, rank, settled, end + 1), 1) for rank in range(world)
        ),
        overhead_s=round(overhead_s(progress, events, settled), 4),
        plans=plans,
        actions=tuple(a.reason for a in actions if a.result == ActionResult.APPLIED),
    )


def ceiling_samples_per_s(speeds: tuple[float, ...], overhead: float, global_batch: int) -> float:
    """The best throughput any split of the global batch gives ranks of these speeds
    (samples per compute second), each step also paying `overhead` seconds: every rank
    done at once. A per-sample model (no fixed part): an upper bound where a rank's speed
    does not depend on whether the other computes at the same time."""
    return global_batch / (global_batch / sum(speeds) + overhead)


def replanned(figures: RunFigures, straggler: int) -> bool:
    """Whether the run switched, after onset, to a plan giving the straggler the least."""
    return any(
        p.first_step >= figures.onset and p.batches[straggler] < max(p.batches)
        for p in figures.plans[1:]
    )


@dataclass(frozen=True)
class Turn:
    """One `none` run and one `lb-bsp` run, measured back to back."""

    none: RunFigures
    balanced: RunFigures
    global_batch: int
    discarded: int = 0  # runs measured again: their neighbour did not slow its rank

    @property
    def ratio(self) -> float:
        return self.balanced.after_samples_per_s / self.none.after_samples_per_s

    @property
    def ceiling_ratio(self) -> float:
        best = ceiling_samples_per_s(
            self.none.speeds_after, self.none.overhead_s, self.global_batch
        )
        return best / self.none.after_samples_per_s


def plans_text(plans: tuple[Plan, ...]) -> str:
    return ", ".join(f"v{p.version} {list(p.batches)} from step {p.first_step}" for p in plans)


def turn_lines(turns: list[Turn], straggler: int) -> list[str]:
    """What each turn measured, one line per run and one for the pair."""
    lines = []
    for n, turn in enumerate(turns, 1):
        for run in (turn.none, turn.balanced):
            lines.append(
                f"contention, turn {n}, {run.policy}: {run.before_samples_per_s:,.0f} samples/s "
                f"before onset (step {run.onset}), {run.after_samples_per_s:,.0f} after it "
                f"settled ({run.after_all_samples_per_s:,.0f} over all steps after onset); rank "
                f"{straggler} x{run.slowdown:.2f} slower per sample than before against the "
                f"other rank; plans: {plans_text(run.plans)}"
            )
        lines.append(
            f"contention, turn {n}: lb-bsp/none after onset x{turn.ratio:.2f}; ceiling "
            f"x{turn.ceiling_ratio:.2f} (perfect balance at none's rank speeds after onset, "
            f"{', '.join(f'{v:,.0f}' for v in turn.none.speeds_after)} samples/s of compute, "
            f"{turn.none.overhead_s * 1000:.0f} ms a step besides)"
            + (f"; {turn.discarded} run(s) discarded, no contention" if turn.discarded else "")
        )
    return lines


def contention_row(turns: list[Turn], *, onset: int, straggler: int) -> dict[str, Any]:
    """The bench row: lb-bsp's throughput after onset against none's, medians of turns."""
    ratios = [round(t.ratio, 3) for t in turns]
    ceilings = [round(t.ceiling_ratio, 3) for t in turns]
    ratio, ceiling = statistics.median(ratios), statistics.median(ceilings)
    replans = all(replanned(t.balanced, straggler) for t in turns)
    met = "met" if replans and ratio >= TARGET_RATIO else "short"
    return {
        "what": f"2 gloo ranks pinned one per core, a busy loop on rank {straggler}'s core from "
        f"step {onset}: samples/s after onset, lb-bsp",
        "value": statistics.median(t.balanced.after_samples_per_s for t in turns),
        "baseline": statistics.median(t.none.after_samples_per_s for t in turns),
        "baseline_what": "same job, policy none",
        "ratio": ratio,
        "ratios": ratios,
        "ceiling": ceiling,
        "ceilings": ceilings,
        "replanned": replans,
        "discarded_runs": sum(t.discarded for t in turns),
        "target": f"lb-bsp replans, ratio >= {TARGET_RATIO} (ceiling x{ceiling:.2f}): {met}",
        "details": [
            {"none": t.none.as_dict(), "lb-bsp": t.balanced.as_dict(), "ratio": r, "ceiling": c}
            for t, r, c in zip(turns, ratios, ceilings, strict=True)
        ],
    }
