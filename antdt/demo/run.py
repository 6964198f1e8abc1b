"""Orchestrates `make demo`: embedded nats-server + etcd, the three services in their own
process, then the same 4-rank job twice (policy `none`, then `lb-bsp`) with rank 3 made
3x slower from step 30; live progress while it trains; at the end a table, a JSON and a
report per run (PNG + HTML, drawn from what JetStream recorded).

The slowdown is real work: each rank runs in a CPU budget of its own, and from the onset
rank 3 shares its budget with two busy loops. Where no cgroup quota can be written, the
demo says so and falls back to the agent's injected sleep, which frees the CPU for the
other ranks and so flatters every policy."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column

from antdt.demo.stats import RunStats, summarize, write_table
from antdt.demo.watch import JobWatcher
from antdt.runtime.cpubudget import BudgetsUnavailable, RankBudgets
from antdt.runtime.servers import EmbeddedCluster, ManagedProcess

if TYPE_CHECKING:
    from antdt.observe import ReportFiles
    from antdt.runtime.config import NatsSettings

WORLD = 4
GLOBAL_BATCH = 1024
SHARD_SIZE = 128
DATASET = 24_000
ONSET = 30
FACTOR = 3.0
STRAGGLER = 3
POLICIES = ("none", "lb-bsp")

console = Console(width=None if Console().is_terminal else 120)


def wait_services(log_path: Path, proc: ManagedProcess, timeout: float = 60) -> None:
    needles = ("monitor started", "controller started", "shards service started")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        if all(n in text for n in needles):
            return
        if not proc.alive():
            raise RuntimeError(f"services exited during start:\n{proc.log_tail()}")
        time.sleep(0.1)
    raise RuntimeError(f"services not ready after {timeout}s:\n{proc.log_tail()}")


def rank_cpus() -> float:
    """Each rank's budget: the machine's cores shared by the ranks, half a core spared
    for the services and servers."""
    return min(1.0, max(0.2, (len(os.sched_getaffinity(0)) - 0.5) / WORLD))


def _job_env(
    cluster: EmbeddedCluster, job: str, policy: str, epochs: int, out: Path, sleep: bool
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ANTDT_NATS__URL=cluster.nats.url,
        ANTDT_JOB=job,
        ANTDT_POLICY=policy,
        ANTDT_DATASET_SIZE=str(DATASET),
        ANTDT_SHARD_SIZE=str(SHARD_SIZE),
        ANTDT_GLOBAL_BATCH=str(GLOBAL_BATCH),
        ANTDT_EPOCHS=str(epochs),
        ANTDT_SEED="7",
        ANTDT_INJECT=f"rank={STRAGGLER},factor={FACTOR:g},from={ONSET}" if sleep else "",
        ANTDT_DEMO_OUT=str(out),
        ANTDT_TELEMETRY__LOG_FORMAT="json",
        ANTDT_TELEMETRY__LOG_LEVEL="warning",
    )
    return env


def _run_job(
    cluster: EmbeddedCluster, policy: str, epochs: int, total_steps: int, out: Path
) -> RunStats:
    from antdt.agent.launch import launch

    job = f"demo-{policy.replace('-', '')}-{int(time.time())}"
    out.mkdir(parents=True, exist_ok=True)
    progress_file = out / "progress.jsonl"
    progress_file.unlink(missing_ok=True)
    watcher = JobWatcher(cluster.nats.url, job).start()
    rc: list[int] = []
    command = [sys.executable, "-m", "antdt.demo.train"]
    budgets = _budgets(job)
    env = _job_env(cluster, job, policy, epochs, out, sleep=budgets is None)
    if budgets is not None:
        command = budgets.command(command)
    runner = threading.Thread(target=lambda: rc.append(launch(WORLD, command, env=env)))
    started = time.time()
    runner.start()
    try:
        _train(runner, budgets, progress_file, policy, total_steps, watcher)
    finally:
        runner.join()
        if budgets is not None:
            budgets.close()
    watcher.stop()
    if not rc or rc[0] != 0:
        raise RuntimeError(f"training with policy {policy} failed (exit {rc}); see {out}")
    return summarize(
        injection="a sleep" if budgets is None else f"busy loops in rank {STRAGGLER}'s CPU budget",
        ceiling_share=(WORLD - 1 + 1 / FACTOR) / WORLD,
        policy=policy,
        job=job,
        progress=[json.loads(line) for line in progress_file.read_text().splitlines()],
        result=json.loads((out / "result.json").read_text()),
        health=watcher.health,
        actions=watcher.actions,
        onset=ONSET,
        wall_s=time.time() - started,
    )


def _budgets(job: str) -> RankBudgets | None:
    try:
        return RankBudgets(job, WORLD, rank_cpus(), round(FACTOR) - 1)
    except BudgetsUnavailable as exc:
        console.print(
            f"[yellow]no CPU budgets ({exc}): rank {STRAGGLER} sleeps instead, which frees the "
            "CPU for the others and flatters every policy"
        )
        return None


def _train(
    runner: threading.Thread,
    budgets: RankBudgets | None,
    progress_file: Path,
    policy: str,
    total_steps: int,
    watcher: JobWatcher,
) -> None:
    """Show progress until the ranks end; start the contention at the onset."""
    # The summary wraps under the bar rather than squeezing it (a narrow terminal).
    columns = (
        TextColumn("{task.description}"),
        BarColumn(bar_width=24),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}", table_column=Column(overflow="fold")),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(f"policy {policy:7}", total=total_steps, info="")
        while runner.is_alive():
            runner.join(0.02)
            steps = _count_lines(progress_file)
            if budgets is not None and steps >= ONSET:  # steps 0..ONSET-1 are done
                budgets.slow({STRAGGLER})
            # Epoch tails (uneven batches) may add steps to the estimate.
            bar.update(
                task, completed=steps, total=max(steps, total_steps), info=watcher.summary_line()
            )
        steps = _count_lines(progress_file)
        bar.update(task, completed=steps, total=steps, info=watcher.summary_line())


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def run_demo(out: Path, *, steps: int = 150) -> int:
    from antdt.runtime.telemetry.logs import configure_logging

    configure_logging("warning", "console")  # the demo's own output is the table
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    steps_per_epoch = math.ceil(DATASET / GLOBAL_BATCH)
    epochs = max(1, math.ceil(steps / steps_per_epoch))
    total_steps = epochs * steps_per_epoch
    console.rule("[bold]AntDT demo")
    console.print(
        f"{WORLD} ranks (gloo on CPU), MLP 64-1024-1024-10 on augmented sklearn digits "
        f"({DATASET} samples), global batch {GLOBAL_BATCH}, {epochs} epochs (~{total_steps} "
        f"steps); rank {STRAGGLER} becomes {FACTOR:g}x slower from step {ONSET}; each rank in a "
        f"budget of {rank_cpus():.2f} CPU."
    )
    with EmbeddedCluster(root=out / "cluster") as cluster:
        env = dict(os.environ, ANTDT_WINDOW="5", ANTDT_TELEMETRY__LOG_FORMAT="json")
        argv = [
            sys.executable,
            "-m",
            "antdt.cli",
            "services",
            "--nats-url",
            cluster.nats.url,
            "--etcd-endpoint",
            cluster.etcd.endpoint,
        ]
        log_path = out / "services.log"
        log_path.unlink(missing_ok=True)
        services = ManagedProcess("antdt services", argv, log_path, env=env).spawn()
        try:
            wait_services(log_path, services)
            console.print(f"nats {cluster.nats.url}, etcd {cluster.etcd.endpoint}, services up")
            runs = [_run_job(cluster, p, epochs, total_steps, out / p) for p in POLICIES]
            reports = [_report(cluster, run, out / run.policy) for run in runs]
        finally:
            services.stop()
    write_table(console, runs)
    results = out / "results.json"
    results.write_text(json.dumps([r.as_dict() for r in runs], indent=2))
    console.print(f"figures written to [bold]{results}[/]; service log {log_path}")
    for run, files in zip(runs, reports, strict=True):
        console.print(f"report of the {run.policy} run: [bold]{files.png}[/]  {files.html}")
    return 0


def _report(cluster: EmbeddedCluster, run: RunStats, folder: Path) -> ReportFiles:
    """The run's picture, drawn from what JetStream recorded (as `antdt report` does),
    and its recorded steps as `steps.jsonl` (`antdt sim --from-steps` replays them)."""
    from antdt.observe import report_job
    from antdt.runtime.config import NatsSettings

    nats = NatsSettings(url=cluster.nats.url)
    console.print(f"drawing the {run.policy} run's report from what JetStream recorded")
    files = asyncio.run(report_job(nats, run.job, folder, console=console))
    asyncio.run(_save_steps(nats, run.job, folder / "steps.jsonl"))
    return files


async def _save_steps(nats: NatsSettings, job: str, path: Path) -> None:
    from antdt.observe import fetch_run
    from antdt.runtime.bus import Bus
    from antdt.schemas import Subjects
    from antdt.sim.recording import save_steps

    bus = await Bus(nats, name=f"antdt-demo-steps-{job}").connect(retry_for_s=10)
    try:
        record = await fetch_run(bus, Subjects(nats.subject_prefix), job)
    finally:
        await bus.close()
    save_steps(path, record.steps)


def main(argv: list[str] | None = None) -> Any:
    return run_demo(Path((argv or sys.argv[1:] or ["runs/demo"])[0]))
