"""`antdt sim --from-job J` / `--from-steps FILE`: a finished run's recorded steps
replayed under other policies (antdt.sim.replay); the I/O: reading the steps from
JetStream (ANTDT_STEPS) or a file, printing and writing the figures."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from antdt.schemas import StepEvent

if TYPE_CHECKING:
    from antdt.runtime.config import NatsSettings

out = Console(width=None if Console().is_terminal else 140)
err = Console(stderr=True)


def replay_run(
    job: str | None,
    steps_file: Path | None,
    save: Path | None,
    policies: list[str] | None,
    out_dir: Path,
    nats_url: str | None,
) -> None:
    try:
        from antdt.sim.files import POLICY_NAMES
        from antdt.sim.recording import load_steps, save_steps
        from antdt.sim.replay import ReplayError, replay
        from antdt.sim.report import replay_json, replay_table
    except ImportError as exc:
        err.print(f"[red]sim: {exc}; install antdt\\[sim][/]")
        raise typer.Exit(2) from None
    try:
        if job is not None and steps_file is None:
            events = _from_job(job, nats_url)
        elif steps_file is not None and job is None:
            events = load_steps(steps_file)
        else:
            raise ValueError("give one of --from-job and --from-steps")
    except (OSError, ValueError) as exc:
        err.print(f"[red]sim: {exc}[/]")
        raise typer.Exit(2) from None
    if save is not None:
        print(save_steps(save, events))
    try:
        result = replay(events, policies or POLICY_NAMES)
    except ReplayError as exc:
        err.print(f"[red]sim: {exc}[/]")
        raise typer.Exit(2) from None
    out.print(replay_table(result))
    out_dir.mkdir(parents=True, exist_ok=True)
    print(replay_json(out_dir / f"{result.scenario.name}.json", result))


def _from_job(job: str, nats_url: str | None) -> list[StepEvent]:
    from antdt.cli.clients import client_settings, quiet_logs
    from antdt.runtime.bus import BusError

    settings = client_settings(nats_url=nats_url)
    quiet_logs()
    try:
        return asyncio.run(recorded_steps(settings.nats, job))
    except BusError as exc:
        raise ValueError(f"reading job {job}'s steps: {exc}") from None


async def recorded_steps(nats: NatsSettings, job: str) -> list[StepEvent]:
    from antdt.observe.recorder import STEP_STREAM
    from antdt.runtime.bus import Bus, StreamMissing
    from antdt.schemas import Subjects

    bus = await Bus(nats, name=f"antdt-sim-{job}").connect(retry_for_s=10)
    try:
        read = await bus.jetstream.read(
            STEP_STREAM, Subjects(nats.subject_prefix).step(job, "*"), StepEvent, limit=1_000_000
        )
    except StreamMissing:
        raise ValueError(f"stream {STEP_STREAM} does not exist: no steps were recorded") from None
    finally:
        await bus.close()
    if read.truncated:
        err.print(f"[yellow]note: read {len(read.items)} of {read.available} recorded steps[/]")
    if not read.items:
        raise ValueError(f"no steps recorded for job {job!r}")
    return list(read.items)
