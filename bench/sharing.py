"""Work sharing, end to end: the demo's MLP trained by 4 gloo ranks, each in its own CPU
budget (a cgroup quota), against the real services (their own process). A slowed rank
is a rank whose budget it shares with `factor - 1` busy loops (a noisy neighbour inside
its share of the machine: the others' budgets are neither freed nor taken), started and
stopped at step boundaries from a seeded schedule. Per scenario, the policies run in
turn on the same machine; throughput is over the steps after the warm-up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import Progress

from antdt.runtime.bus import Bus
from antdt.runtime.config import NatsSettings
from antdt.runtime.cpubudget import RankBudgets
from antdt.runtime.servers import EmbeddedCluster
from antdt.testing.contention import last_step
from antdt.testing.torchrun import start_torchrun, stop
from bench.contention import job_env, read_progress, record, services
from bench.display import console
from bench.shards_rows import RUNS
from bench.sharing_figures import (
    Burst,
    Comparison,
    RunFigures,
    bursts,
    median_runs,
    persistent,
    rows,
    run_figures,
    slowed,
)

WORLD = 4
SHARING = {"work_sharing": "on"}
RUN_TIMEOUT_S = 600


@dataclass(frozen=True)
class Scenario:
    steps_per_epoch: int = 30
    epochs: int = 3
    warmup: int = 10
    global_batch: int = 2048
    cpus_per_rank: float = 0.4
    factor: int = 3  # a slowed rank shares its budget with factor - 1 busy loops
    seed: int = 1
    detector_window: int = 5
    turns: int = 2  # each configuration's runs; the median one counts

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch


#: The bench-test's: fewer steps.
SHORT = Scenario(steps_per_epoch=12, epochs=2, warmup=4, global_batch=1024, turns=1)


@dataclass(frozen=True)
class Config:
    """One run's policy: its name in the table, the policy and its params."""

    label: str
    policy: str
    params: dict[str, Any]


@contextlib.asynccontextmanager
async def driven(
    budgets: RankBudgets, schedule: list[Burst], progress: Path
) -> AsyncIterator[None]:
    """Follow rank 0's progress: before each step, slow the ranks the schedule names."""

    async def follow() -> None:
        seen: int | None = -2
        while True:
            done = last_step(progress)
            if done != seen:
                seen = done
                budgets.slow(slowed(schedule, (done if done is not None else -1) + 1))
            await asyncio.sleep(0.005)

    task = asyncio.create_task(follow())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        budgets.slow(set())


async def run_once(
    cluster: EmbeddedCluster, s: Scenario, cfg: Config, schedule: list[Burst], out: Path
) -> RunFigures:
    job = f"share-{cfg.label.replace('+', '-')}-{time.time_ns() % 10**12}"
    out.mkdir(parents=True, exist_ok=True)
    progress = out / "progress.jsonl"
    progress.unlink(missing_ok=True)
    budgets = await asyncio.to_thread(RankBudgets, job, WORLD, s.cpus_per_rank, s.factor - 1)
    bus = await Bus(NatsSettings(url=cluster.nats.url), name=f"bench-{job}").connect()
    try:
        got = await record(bus, job)
        # torchrun, as users start jobs: the c10d store (the claims') is in its agent,
        # outside every rank's budget.
        script = ["--no-python", *budgets.command([sys.executable, "-m", "antdt.demo.train"])]
        env = job_env(cluster, s, job, cfg.policy, out, cfg.params)
        env["ANTDT_DEMO_COMPUTE_LOG"] = "1"  # each rank's forward/backward s, the ceiling's
        async with driven(budgets, schedule, progress):
            proc = start_torchrun(WORLD, 0, script, env, out / "torchrun.log")
            try:
                rc = await asyncio.to_thread(proc.wait, RUN_TIMEOUT_S)
            finally:
                stop(proc)
        await asyncio.sleep(0.5)  # the last step events, published as the ranks closed
    finally:
        await bus.close()
        await asyncio.to_thread(budgets.close)
    if rc != 0:
        raise RuntimeError(f"the {cfg.label} run failed (exit {rc}): see {out}")
    (out / "steps.jsonl").write_text("".join(e.model_dump_json() + "\n" for e in got.steps))
    firsts = frozenset(b.start for b in schedule)  # no offer from the step before
    return run_figures(cfg.label, read_progress(progress), s.warmup, s.steps, computes(out), firsts)


def computes(out: Path) -> dict[int, list[float]]:
    """Each step's forward/backward seconds by rank (the demo's compute logs): the
    part of a step that sharing samples can move. A step event's compute_s also holds
    the optimizer step and the agent's work between steps, which a slowed rank pays
    slowed whatever it shares (spread as well, they put none's ceiling 4% higher)."""
    by_step: dict[int, list[float]] = {}
    for log in sorted(out.glob("compute-*.jsonl")):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            by_step.setdefault(int(record["step"]), []).append(float(record["compute_s"]))
    return by_step


@dataclass(frozen=True)
class Case:
    """A scenario: its schedule and the configurations it compares."""

    name: str
    schedule: list[Burst]
    configs: tuple[Config, ...]


def cases(s: Scenario) -> list[Case]:
    none = Config("none", "none", {})
    lbbsp = Config("lb-bsp", "lb-bsp", {})
    nd_sharing = Config("antdt-nd+sharing", "antdt-nd", SHARING)
    return [
        Case(
            "transient",
            bursts(s.seed, world=WORLD, first=s.warmup, last=s.steps),
            (none, lbbsp, nd_sharing),
        ),
        Case(
            "persistent",
            persistent(WORLD - 1, s.warmup, s.steps),
            (lbbsp, nd_sharing),
        ),
        Case("healthy", [], (none, Config("none+sharing", "none", SHARING))),
    ]


async def bench_sharing(
    cluster: EmbeddedCluster, s: Scenario, out: Path, only: tuple[str, ...] = ()
) -> dict[str, Comparison]:
    """Every case's configurations (or only the cases named), `s.turns` times, each
    turn's order the reverse of the last (ABBA: drift on the machine falls on all of
    them alike); per configuration the run of median throughput, by case."""
    out.mkdir(parents=True, exist_ok=True)
    todo = [c for c in cases(s) if not only or c.name in only]
    runs: dict[str, dict[str, list[RunFigures]]] = {c.name: {} for c in todo}
    total = s.turns * sum(len(c.configs) for c in todo)
    with services(cluster, s.detector_window, out), Progress(console=console) as bar:
        task = bar.add_task("work sharing runs", total=total)
        for turn in range(s.turns):
            for case in todo:
                for cfg in case.configs if turn % 2 == 0 else case.configs[::-1]:
                    bar.update(task, description=f"work sharing: {case.name}, {cfg.label}")
                    where = out / case.name / cfg.label / str(turn)
                    got = await run_once(cluster, s, cfg, case.schedule, where)
                    runs[case.name].setdefault(cfg.label, []).append(got)
                    bar.advance(task)
    return {
        name: Comparison(name, {label: median_runs(label, r) for label, r in by.items()})
        for name, by in runs.items()
    }


def slowed_steps(s: Scenario) -> int:
    return sum(b.steps for b in cases(s)[0].schedule)


async def sharing_rows(
    cluster: EmbeddedCluster, s: Scenario = Scenario(), out: Path = RUNS / "sharing"
) -> list[dict[str, Any]]:
    """The rows of `make bench`, and the picture of the runs (out/sharing.png)."""
    got = await bench_sharing(cluster, s, out)
    bursts = len(cases(s)[0].schedule)
    made = rows(got, world=WORLD, factor=s.factor, slowed=slowed_steps(s), bursts=bursts)
    console.print(f"work sharing: picture in {save_sharing_chart(got, out / 'sharing.png')}")
    return made


def save_sharing_chart(got: dict[str, Comparison], path: Path) -> Path:
    """Each case's configurations as bars of samples/s."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11.0, 3.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(got), squeeze=False)[0]
    for ax, (name, comparison) in zip(axes, got.items(), strict=True):
        labels = list(comparison.runs)
        values = [comparison.runs[k].throughput for k in labels]
        colors = ["C0" if "sharing" in k else "grey" for k in labels]
        bars = ax.bar(labels, values, color=colors)
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], padding=2)
        ax.set_title(name)
        ax.tick_params(axis="x", labelrotation=15)
    axes[0].set_ylabel("samples/s after warm-up")
    fig.suptitle(f"Work sharing, {WORLD} gloo ranks in CPU budgets (blue: sharing on)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=110)
    return path
