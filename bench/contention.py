"""Real contention, end to end: the demo's MLP trained by 2 gloo ranks, each pinned to its
own core, against the real services (their own process, floating); from step `onset` a
busy loop pinned to the last rank's core (a noisy neighbour, not a sleep). The same job
runs under policy none and lb-bsp, in turns, so both see the same machine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import NatsSettings
from antdt.runtime.servers import EmbeddedCluster, ManagedProcess
from antdt.schemas import ActionRecord, StepEvent, Subjects
from antdt.testing import cores, foreground, neighbour_from_step
from bench.children import ROOT
from bench.contention_figures import (
    NeighbourTooWeak,
    RunFigures,
    Turn,
    Window,
    check_contention,
    contention_row,
    run_figures,
    turn_lines,
)
from bench.display import console
from bench.shards_rows import RUNS

WORLD = 2
STRAGGLER = WORLD - 1
POLICIES = ("none", "lb-bsp")
#: The services' log says these once they listen.
STARTED = ("monitor started", "controller started", "shards service started")


@dataclass(frozen=True)
class Scenario:
    """One run: `epochs` of `steps_per_epoch` full global batches; `neighbours` busy
    loops on the straggler's core from step `onset` (0: none, the loud failure)."""

    epochs: int = 5
    steps_per_epoch: int = 20
    global_batch: int = 2048
    warmup: int = 10
    onset: int = 30
    settle: int = 25
    turns: int = 2
    neighbours: int = 1
    detector_window: int = 5
    #: Runs of one policy in a turn before a neighbour too weak fails the row: a busy
    #: machine now and then moves its other work onto the other rank's core for a run.
    attempts: int = 3

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch


#: The bench-test's: fewer, shorter steps.
SHORT = Scenario(
    epochs=3, steps_per_epoch=16, global_batch=1024, warmup=5, onset=15, settle=20, turns=1
)


@dataclass
class Recorded:
    """What one run's ranks published, collected live."""

    steps: list[StepEvent]
    actions: list[ActionRecord]


async def record(bus: Bus, job: str) -> Recorded:
    got = Recorded([], [])
    subjects = Subjects(bus.settings.subject_prefix)

    async def on_step(event: StepEvent, _: Delivery) -> None:
        got.steps.append(event)

    async def on_action(action: ActionRecord, _: Delivery) -> None:
        got.actions.append(action)

    await bus.subscribe(subjects.step(job, "*"), StepEvent, on_step)
    await bus.subscribe(subjects.action(job), ActionRecord, on_action)
    await bus.flush()
    return got


class JobShape(Protocol):
    @property
    def steps_per_epoch(self) -> int: ...
    @property
    def global_batch(self) -> int: ...
    @property
    def epochs(self) -> int: ...


def job_env(
    cluster: EmbeddedCluster,
    shape: JobShape,
    job: str,
    policy: str,
    out: Path,
    params: dict[str, Any] | None = None,
) -> dict[str, str]:
    """The demo's training script's settings: no injected slowdown (the neighbour is
    real); the bench's own modules importable from the ranks."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
        ANTDT_NATS__URL=cluster.nats.url,
        ANTDT_JOB=job,
        ANTDT_POLICY=policy,
        ANTDT_POLICY_PARAMS=json.dumps(params or {}),
        ANTDT_DATASET_SIZE=str(shape.steps_per_epoch * shape.global_batch),
        ANTDT_SHARD_SIZE="128",
        ANTDT_GLOBAL_BATCH=str(shape.global_batch),
        ANTDT_EPOCHS=str(shape.epochs),
        ANTDT_SEED="7",
        ANTDT_DEMO_OUT=str(out),
        ANTDT_TELEMETRY__LOG_FORMAT="json",
        ANTDT_TELEMETRY__LOG_LEVEL="warning",
    )
    return env


def read_progress(path: Path) -> list[dict[str, object]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines if line.endswith("}")]


async def run_once(
    cluster: EmbeddedCluster, scenario: Scenario, policy: str, out: Path
) -> RunFigures:
    """One run of the job under `policy`; its figures."""
    from antdt.agent.launch import launch

    name = f"contend-{policy.replace('-', '')}-{time.time_ns() % 10**12}"
    out.mkdir(parents=True, exist_ok=True)
    progress = out / "progress.jsonl"
    progress.unlink(missing_ok=True)
    pinned = cores()[:WORLD]
    bus = await Bus(NatsSettings(url=cluster.nats.url), name=f"bench-{name}").connect()
    try:
        got = await record(bus, name)
        command = [sys.executable, "-m", "antdt.demo.train"]
        env = job_env(cluster, scenario, name, policy, out)
        job = asyncio.ensure_future(
            asyncio.to_thread(launch, WORLD, command, env=env, cores=pinned)
        )
        try:
            core, many = pinned[STRAGGLER], scenario.neighbours
            async with neighbour_from_step(
                core, progress, scenario.onset, job, processes=many
            ) as onset:
                rc = await job
        finally:
            await asyncio.wait([job])  # the ranks end with the job: none left behind
        if rc != 0:
            raise RuntimeError(f"the {policy} run failed (exit {rc}): see {out}")
        await asyncio.sleep(0.5)  # the last step events, published as the ranks closed
    finally:
        await bus.close()
    (out / "steps.jsonl").write_text("".join(e.model_dump_json() + "\n" for e in got.steps))
    window = Window(scenario.warmup, onset, scenario.settle)
    figures = run_figures(
        policy=policy,
        job=name,
        progress=read_progress(progress),
        events=got.steps,
        actions=got.actions,
        window=window,
        world=WORLD,
        straggler=STRAGGLER,
    )
    check_contention(figures, STRAGGLER)  # before the next run: no figures without it
    return figures


@contextlib.contextmanager
def services(cluster: EmbeddedCluster, window: int, out: Path) -> Iterator[ManagedProcess]:
    """The three services in their own process (not pinned: they float), until the end;
    `window`: the monitor's detector window, steps."""
    env = dict(
        os.environ,
        ANTDT_WINDOW=str(window),
        ANTDT_TELEMETRY__LOG_FORMAT="json",
    )
    argv = [sys.executable, "-m", "antdt.cli", "services", "--nats-url", cluster.nats.url]
    argv += ["--etcd-endpoint", cluster.etcd.endpoint]
    log = out / "services.log"
    log.unlink(missing_ok=True)
    proc = ManagedProcess("antdt services", argv, log, env=env).spawn()
    try:
        deadline = time.monotonic() + 60
        while not all(
            n in (log.read_text(errors="replace") if log.exists() else "") for n in STARTED
        ):
            if not proc.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"services did not start:\n{proc.log_tail()}")
            time.sleep(0.1)
        yield proc
    finally:
        proc.stop()


async def bench_contention(
    cluster: EmbeddedCluster, scenario: Scenario, out: Path
) -> tuple[list[Turn], bool]:
    """`scenario.turns` turns of none then lb-bsp (ABBA: every other turn reversed), in
    the foreground of the machine where permitted (the second value says whether)."""
    if len(cores()) < WORLD:
        raise RuntimeError(f"needs {WORLD} cores to pin {WORLD} ranks, has {len(cores())}")
    out.mkdir(parents=True, exist_ok=True)
    turns = []
    with foreground() as isolated, services(cluster, scenario.detector_window, out):
        for turn in range(scenario.turns):
            order = POLICIES if turn % 2 == 0 else POLICIES[::-1]
            runs, discarded = {}, 0
            for policy in order:
                runs[policy], weak = await contended_run(cluster, scenario, policy, out, turn)
                discarded += weak
            turns.append(Turn(runs["none"], runs["lb-bsp"], scenario.global_batch, discarded))
    return turns, isolated


async def contended_run(
    cluster: EmbeddedCluster, scenario: Scenario, policy: str, out: Path, turn: int
) -> tuple[RunFigures, int]:
    """The first of `scenario.attempts` runs whose neighbour slowed its rank, and how many
    were discarded before it (each kept in its own folder); the last NeighbourTooWeak
    when none did."""
    for attempt in range(scenario.attempts):
        folder = out / (f"{turn}-{policy}" + (f"-again{attempt}" if attempt else ""))
        try:
            return await run_once(cluster, scenario, policy, folder), attempt
        except NeighbourTooWeak as weak:
            if attempt + 1 >= scenario.attempts:
                raise
            console.print(f"contention: run discarded, measured again: {weak}")
    raise ValueError(f"attempts must be at least 1, not {scenario.attempts}")


async def contention_rows(
    cluster: EmbeddedCluster, scenario: Scenario = Scenario(), out: Path = RUNS / "contention"
) -> list[dict[str, Any]]:
    """The row of `make bench`; raises NeighbourTooWeak when a run measured no contention."""
    what = f"{WORLD} pinned ranks, a noisy neighbour from step {scenario.onset}, none vs lb-bsp"
    with console.status(what):
        turns, isolated = await bench_contention(cluster, scenario, out)
    for line in turn_lines(turns, STRAGGLER):
        console.print(line)
    if not isolated:
        console.print("contention: not in the foreground (no CAP_SYS_NICE): other work shares it")
    row = contention_row(turns, onset=scenario.onset, straggler=STRAGGLER)
    return [{**row, "foreground": isolated}]
