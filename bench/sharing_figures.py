"""Work sharing's bench, the pure half: the seeded schedule of contention bursts, and the
figures of a run from rank 0's progress (one record per step: step, t, samples).

A burst slows one rank `factor` x for 3-6 steps; bursts cover about `fraction` of the
measured steps, one rank at a time, none in the warm-up."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Burst:
    rank: int
    start: int  # the first step it slows
    steps: int

    def covers(self, step: int) -> bool:
        return self.start <= step < self.start + self.steps


def bursts(
    seed: int,
    *,
    world: int,
    first: int,
    last: int,
    fraction: float = 0.2,
    lengths: tuple[int, int] = (3, 6),
) -> list[Burst]:
    """Bursts on random ranks over steps [first, last), about `fraction` of them slowed,
    with at least 2 calm steps between two bursts."""
    rng = random.Random(seed)
    span = last - first
    target = round(span * fraction)
    count = max(1, round(target / (sum(lengths) / 2)))
    gap = (span - target) / (count + 1)  # the mean calm stretch between bursts

    def calm() -> int:
        return max(2, round(rng.uniform(0.5, 1.5) * gap))

    out: list[Burst] = []
    covered, step = 0, first + calm()
    while covered < target:
        length = min(rng.randint(*lengths), target - covered)
        if step + length > last:
            break
        out.append(Burst(rng.randrange(world), step, length))
        covered += length
        step += length + calm()
    return out


def slowed(schedule: list[Burst], step: int) -> set[int]:
    """The ranks the schedule slows at `step`."""
    return {b.rank for b in schedule if b.covers(step)}


def persistent(rank: int, first: int, last: int) -> list[Burst]:
    """One burst over the whole measured span: a straggler that stays."""
    return [Burst(rank, first, last - first)]


@dataclass(frozen=True)
class RunFigures:
    """One run: samples per second over the measured steps, and the mean step time;
    `ideal_throughput`: the same steps had each one's compute been spread over the
    ranks perfectly, with everything else as measured (None: no compute figures);
    `ideal_late_throughput`: the same but for the steps no offer decided on the step
    before can reach (each burst's first), paid as measured."""

    label: str
    throughput: float
    step_s: float
    steps: int
    ideal_throughput: float | None = None
    ideal_late_throughput: float | None = None


def run_figures(
    label: str,
    progress: list[dict[str, Any]],
    first: int,
    last: int,
    computes: dict[int, list[float]] | None = None,
    late: frozenset[int] = frozenset(),
) -> RunFigures:
    """Throughput over steps [first, last): from the end of step first-1 to the end of
    step last-1, the samples of steps first..last-1. `computes`: each step's compute
    seconds by rank, for `ideal_throughput`; `late`: the steps only a late offer could
    share, for `ideal_late_throughput`."""
    by_step = {int(r["step"]): r for r in progress}
    missing = [s for s in range(first - 1, last) if s not in by_step]
    if missing:
        raise RuntimeError(f"{label}: progress lacks steps {missing[:5]}")
    t0, t1 = float(by_step[first - 1]["t"]), float(by_step[last - 1]["t"])
    samples = sum(int(by_step[s]["samples"]) for s in range(first, last))
    gaps = {s: float(by_step[s]["t"]) - float(by_step[s - 1]["t"]) for s in range(first, last)}
    ideal = ideal_late = None
    if computes:
        saving = {s: spread_saving(computes.get(s, [])) for s in gaps}
        ideal = samples / sum(g - saving[s] for s, g in gaps.items())
        ideal_late = samples / sum(g - (0 if s in late else saving[s]) for s, g in gaps.items())
    mean_step = statistics.mean(gaps.values())
    return RunFigures(label, samples / (t1 - t0), mean_step, last - first, ideal, ideal_late)


def spread_saving(computes: list[float]) -> float:
    """Seconds a step of equal shares saves when its compute is spread over the ranks
    at their speeds in it (perfect work sharing, free): the slowest rank's compute less
    the water level world / sum(1 / compute). The all-reduce, data wait and the rest
    stay as measured: a rank slowed by a noisy neighbour also slows its part of a CPU
    all-reduce, which no sharing of samples wins back. 0 without every rank's figure."""
    if len(computes) < 2 or min(computes) <= 0:
        return 0.0
    return max(computes) - len(computes) / sum(1.0 / c for c in computes)


@dataclass(frozen=True)
class Comparison:
    """One scenario's runs, by label, and the ratios its acceptance names."""

    scenario: str
    runs: dict[str, RunFigures]

    def ratio(self, a: str, b: str) -> float:
        return self.runs[a].throughput / self.runs[b].throughput


def median_runs(label: str, runs: list[RunFigures]) -> RunFigures:
    """Repeats of one configuration as one: the median throughput and step time."""
    if not runs:
        raise ValueError(f"{label}: no runs")
    ideals = [r.ideal_throughput for r in runs if r.ideal_throughput is not None]
    lates = [r.ideal_late_throughput for r in runs if r.ideal_late_throughput is not None]
    return RunFigures(
        label,
        statistics.median(r.throughput for r in runs),
        statistics.median(r.step_s for r in runs),
        runs[0].steps,
        statistics.median(ideals) if ideals else None,
        statistics.median(lates) if lates else None,
    )


def transient_ceiling(schedule_steps: int, steps: int, world: int, factor: float) -> float:
    """The best throughput ratio to `none` when a fraction of the steps has one rank
    `factor` x slower: under `none` such a step takes `factor`, with the work spread
    over the capacity that is left it takes world / (world - 1 + 1 / factor)."""
    slow = schedule_steps / steps
    shared = world / (world - 1 + 1 / factor)
    return ((1 - slow) + slow * factor) / ((1 - slow) + slow * shared)


def one_step_late_ceiling(
    schedule_steps: int, bursts: int, steps: int, world: int, factor: float
) -> float:
    """transient_ceiling for offers decided on the step before: each burst's first step
    is paid in full (`factor`), its others shared."""
    shared = world / (world - 1 + 1 / factor)
    calm = steps - schedule_steps
    paid = bursts * factor + (schedule_steps - bursts) * shared
    return (calm + schedule_steps * factor) / (calm + paid)


def rows(
    got: dict[str, Comparison], *, world: int, factor: float, slowed: int, bursts: int = 0
) -> list[dict[str, Any]]:
    """The table's rows: each case's acceptance ratios, next to target and ceiling (and,
    given the `bursts`, the ceiling of offers decided one step late)."""
    out = []
    t = got["transient"]
    steps = t.runs["none"].steps
    compute_only = transient_ceiling(slowed, steps, world, factor)
    late = one_step_late_ceiling(slowed, bursts, steps, world, factor) if bursts else None
    ideal, ideal_late = t.runs["none"].ideal_throughput, t.runs["none"].ideal_late_throughput
    for base, target in (("none", 1.25), ("lb-bsp", 1.2)):
        # The ceiling: none's own steps with their compute spread perfectly (measured),
        # else the bursts' compute alone (the all-reduce unslowed); the same for offers
        # decided on the step before (each burst's first step paid as measured).
        to_base = t.runs["none"].throughput / t.runs[base].throughput
        ceiling = ideal / t.runs[base].throughput if ideal else compute_only * to_base
        row = _row(t, "antdt-nd+sharing", base, target, ceiling, "transient 3x bursts")
        row["ceiling_compute_only"] = compute_only * to_base
        if ideal_late:
            row["ceiling_late"] = ideal_late / t.runs[base].throughput
        elif late:
            row["ceiling_late"] = late * to_base
        out.append(row)
    p = got["persistent"]
    out.append(_row(p, "antdt-nd+sharing", "lb-bsp", 1.0, None, "persistent 3x straggler"))
    h = got["healthy"]
    out.append(_row(h, "none+sharing", "none", 0.98, 1.0, "healthy job", " (cost <= 2%)"))
    return out


def _row(
    c: Comparison,
    label: str,
    base: str,
    minimum: float,
    ceiling: float | None,
    what: str,
    why: str = "",
) -> dict[str, Any]:
    """The row of `label` against `base`; marked failed when its ratio is below
    `minimum` (make bench then exits non-zero, after every row)."""
    ratio = c.ratio(label, base)
    row = {
        "what": f"work sharing, {what}: {label} throughput, samples/s",
        "value": c.runs[label].throughput,
        "baseline": c.runs[base].throughput,
        "baseline_what": f"{base}, same scenario and run",
        "ratio": ratio,
        "target": f"ratio >= {minimum}{why}",
        "ceiling": ceiling,
    }
    if ratio < minimum:
        row["failed"] = f"work sharing, {what}: {ratio:.3f}x {base} < {minimum}x"
    return row
