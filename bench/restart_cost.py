"""Restart cost: the same small job (2 ranks of the demo's training script) restarted by
AntDT's KILL_RESTART path (the command as the controller sends it: every rank
checkpoints at its step and exits 75, the launcher restarts the group, the ranks restore)
under `antdt launch` and under torchrun, next to torchrun's own restart after a rank is
killed -9; each from its trigger to every rank stepping again (the step events)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import EtcdSettings, NatsSettings, ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.servers import EmbeddedCluster
from antdt.schemas import Ack, KillRestart, RankHello, StepEvent, Subjects
from antdt.services.runner import settings_class, start_service
from antdt.testing.torchrun import kill_rank, start_torchrun, stop

WORLD = 2
#: (launcher, trigger) of each run, in the order they run.
CASES = (("antdt launch", "KILL_RESTART"), ("torchrun", "KILL_RESTART"), ("torchrun", "kill -9"))
#: Steps past the last step event seen at which a KILL_RESTART asks for its checkpoint
#: (ranks run a step or two ahead of their events; the controller also asks ahead).
CHECKPOINT_AHEAD = 5


@dataclass(frozen=True)
class Shape:
    dataset: int = 2560
    batch: int = 64  # 40 steps an epoch
    every: int = 5  # a checkpoint every 5 steps (the kill -9 case restores to one)
    trigger_step: int = 12  # rank 0 past it: the trigger
    min_step_s: float = 0.05  # paced, so that the trigger lands mid-epoch


FULL, TINY = Shape(), Shape(dataset=1280, trigger_step=8)


@dataclass
class Seen:
    """Step events and hellos as they arrive, with this process's clock."""

    events: list[tuple[float, StepEvent]] = field(default_factory=list)
    hellos: list[tuple[float, RankHello]] = field(default_factory=list)

    async def on_step(self, event: StepEvent, _: Delivery) -> None:
        self.events.append((time.monotonic(), event))

    async def on_hello(self, hello: RankHello, _: Delivery) -> None:
        self.hellos.append((time.monotonic(), hello))

    def past(self, rank: int, step: int) -> bool:
        return any(e.rank == rank and e.step >= step for _, e in self.events)

    def last_step(self) -> int:
        return max((e.step for _, e in self.events), default=-1)

    def back_after(self, at: float) -> float | None:
        """Seconds from `at` until every rank's new process (its hello after `at`; a
        process's messages arrive in order) published a step; None: not yet."""
        firsts = []
        for rank in range(WORLD):
            hello = min((t for t, h in self.hellos if h.rank == rank and t > at), default=None)
            times = [t for t, e in self.events if e.rank == rank and hello and t > hello]
            if not times:
                return None
            firsts.append(min(times))
        return max(firsts) - at


def job_env(settings: ServiceSettings, shape: Shape, out: Path, job: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ANTDT_JOB"}
    if job is not None:
        env["ANTDT_JOB"] = job
    env.update(
        ANTDT_NATS__URL=settings.nats.url,
        ANTDT_NATS__SUBJECT_PREFIX=settings.nats.subject_prefix,
        ANTDT_DATASET_SIZE=str(shape.dataset),
        ANTDT_SHARD_SIZE="40",
        ANTDT_GLOBAL_BATCH=str(shape.batch),
        ANTDT_DEMO_WIDTH="32",
        ANTDT_DEMO_OUT=str(out),
        ANTDT_DEMO_CKPT_DIR=str(out),
        ANTDT_DEMO_CKPT_EVERY=str(shape.every),
        ANTDT_DEMO_MIN_STEP_S=str(shape.min_step_s),
        OMP_NUM_THREADS="1",
        ANTDT_TELEMETRY__LOG_FORMAT="json",
        ANTDT_TELEMETRY__LOG_LEVEL="warning",
    )
    return env


async def kill_restart(bus: Bus, subjects: Subjects, job: str, step: int) -> None:
    """What the controller sends every rank: checkpoint at `step`, then restart."""
    cmd = KillRestart(
        action_id=f"bench-{uuid.uuid4().hex[:8]}", job=job, rank=1, checkpoint_step=step
    )
    for rank in range(WORLD):
        ack = await bus.request(subjects.command(job, rank), cmd, Ack, timeout=10)
        if not ack.ok:
            raise RuntimeError(f"rank {rank} refused the KILL_RESTART: {ack.error}")


async def run_case(
    settings: ServiceSettings, shape: Shape, launcher: str, trigger: str, out: Path
) -> float:
    """One run; seconds from the trigger to every rank stepping again."""
    out.mkdir(parents=True, exist_ok=True)
    bus = await Bus(settings.nats, name="bench-restart").connect()
    subjects, seen = Subjects(settings.nats.subject_prefix), Seen()
    job = f"restart-{uuid.uuid4().hex[:10]}"
    await bus.subscribe(subjects.step(job, "*"), StepEvent, seen.on_step)
    await bus.subscribe(subjects.hello(job, "*"), RankHello, seen.on_hello)
    env = job_env(settings, shape, out, job)
    if launcher == "torchrun":
        proc = start_torchrun(WORLD, 1, ["-m", "antdt.demo.train"], env, out / "log")
    else:  # the command, not launch() here: a fork beside this process's gRPC threads crashed
        proc = _start_antdt_launch(env, out / "log")
    try:
        await _until(lambda: seen.past(0, shape.trigger_step), 120, proc)
        at, last = time.monotonic(), seen.last_step()
        if trigger == "kill -9":
            kill_rank(proc.pid, 1)
        else:
            await kill_restart(bus, subjects, job, last + CHECKPOINT_AHEAD)
        await _until(lambda: seen.back_after(at) is not None, 120, proc)
        back = seen.back_after(at)
        assert back is not None
        rc = await asyncio.to_thread(proc.wait, 120)
        if rc != 0:
            raise RuntimeError(f"{launcher} ({trigger}) ended with {rc}: see {out}")
        return back
    finally:
        stop(proc)
        await bus.close()


def _start_antdt_launch(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "antdt.cli", "launch", "--nproc", str(WORLD)]
    argv += ["--spare-slots", "1", "--", sys.executable, "-m", "antdt.demo.train"]
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


async def _until(done: Any, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if proc.poll() is not None:
            await asyncio.sleep(1.0)  # its last step events may still be on their way
            if done():
                return
            raise RuntimeError(f"the job ended (exit {proc.returncode}) before the bench saw it")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the bench saw nothing of the job for {timeout_s:.0f} s")
        await asyncio.sleep(0.05)


async def bench_restart_cost(cluster: EmbeddedCluster, shape: Shape, out: Path) -> dict[str, float]:
    """Seconds to every rank stepping again, per case, against the three services."""
    unique = uuid.uuid4().hex[:8]
    settings = ServiceSettings(
        nats=NatsSettings(url=cluster.nats.url, subject_prefix=f"bench.restart.{unique}"),
        etcd=EtcdSettings(endpoint=cluster.etcd.endpoint, key_prefix=f"/bench-restart/{unique}/"),
        replica_id=f"bench-{unique}",
    )
    runtime = ServiceRuntime("bench-restart")
    for name in ("monitor", "controller", "shards"):
        cls = settings_class(name)
        await start_service(name, cls(**settings.model_dump()), runtime)
    try:
        return {
            f"{trigger} under {launcher}": await run_case(
                settings, shape, launcher, trigger, out / f"{n}"
            )
            for n, (launcher, trigger) in enumerate(CASES)
        }
    finally:
        await runtime.shutdown()


def restart_rows(got: dict[str, float]) -> list[dict[str, Any]]:
    """One row per AntDT restart, against torchrun's own restart after a kill -9."""
    baseline = got["kill -9 under torchrun"]
    return [
        {
            "what": f"restart cost, 2 ranks: {case}, trigger to every rank stepping, ms "
            "(the command sent as the controller sends it, not decided by antdt-nd)",
            "value": seconds * 1000,
            "baseline": baseline * 1000,
            "baseline_what": "torchrun's own restart after kill -9, ms",
            "target": "reported: includes the checkpoint taken on request",
            "details": got,
        }
        for case, seconds in got.items()
        if case != "kill -9 under torchrun"
    ]


def save_restart_chart(got: dict[str, float], path: Path) -> Path:
    """The cases as bars, seconds from the trigger to every rank stepping again."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 3.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    names = list(got)
    bars = ax.barh(names, [got[n] for n in names], color=["C0", "C0", "grey"][: len(names)])
    ax.bar_label(bars, labels=[f"{got[n]:.2f} s" for n in names], padding=3)
    ax.set_xlabel("seconds from the trigger to every rank stepping again")
    ax.set_title("Restart cost, 2 demo ranks, one run (grey: torchrun's own restart)")
    ax.margins(x=0.15)  # room for the labels
    ax.invert_yaxis()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=110)
    return path
