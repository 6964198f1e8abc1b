"""`antdt actions --job J`: what the controller decided for a job, why, and the result,
from the job's ActionRecords in ANTDT_ACTIONS (what its retention still holds), oldest
first, as a table."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from antdt.cli.clients import client_settings, quiet_logs
from antdt.cli.options import JobOpt, NatsOpt
from antdt.runtime.config import NatsSettings
from antdt.schemas import ACTION_STREAM, ActionRecord, ActionResult, Subjects

RESULT_STYLE = {
    ActionResult.APPLIED: "green",
    ActionResult.PARTIAL: "yellow",
    ActionResult.FAILED: "red",
    ActionResult.REFUSED: "magenta",
}


def batches_text(record: ActionRecord) -> str:
    """Per-rank batches; under accumulation each as batch=micro-batch x steps."""
    local = record.local_batch or ()
    micro, accumulation = record.micro_batch, record.accumulation
    if micro is None or accumulation is None or len(micro) != len(local):
        return " ".join(str(b) for b in local)
    parts = []
    for b, m, a in zip(local, micro, accumulation, strict=False):
        parts.append(str(b) if a == 1 else f"{b}={m}x{a}")
    return " ".join(parts)


def when_text(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) + f".{int(at % 1 * 1000):03d}"


def actions_table(job: str, records: Sequence[ActionRecord], *, truncated: bool = False) -> Table:
    """The rich table of `records` (oldest first). Pure."""
    title = f"actions of job {job}: {len(records)}" + (" (truncated)" if truncated else "")
    table = Table(title=title, show_lines=False, expand=False)
    for column in ("decided", "by", "incident", "why", "plan", "batches", "result", "error"):
        table.add_column(column, overflow="fold")
    for r in sorted(records, key=lambda a: (a.decided_at, a.action_id)):
        plan = "" if r.plan_version is None else f"v{r.plan_version} @ step {r.effective_step}"
        result = Text(r.result.value, style=RESULT_STYLE.get(r.result, ""))
        if r.missing_ranks:
            result.append(f" missing {','.join(map(str, r.missing_ranks))}")
        took = max(0.0, r.completed_at - r.decided_at)
        table.add_row(
            when_text(r.decided_at),
            r.policy,
            r.incident_id or "",
            r.reason,
            plan,
            batches_text(r),
            result + Text(f" {took * 1e3:.0f} ms", style="dim"),
            r.error or "",
        )
    return table


async def fetch_actions(
    nats: NatsSettings, job: str, limit: int
) -> tuple[list[ActionRecord], bool]:
    """The job's ActionRecords held in ANTDT_ACTIONS, oldest first, and whether `limit`
    cut the list short. Raises StreamMissing when nothing was ever recorded."""
    from antdt.runtime.bus import Bus

    subjects = Subjects(nats.subject_prefix)
    bus = await Bus(nats, name=f"antdt-actions-{job}").connect(retry_for_s=10)
    try:
        replay = await bus.jetstream.read(
            ACTION_STREAM, subjects.action(job), ActionRecord, limit=limit
        )
    finally:
        await bus.close()
    return [r for r in replay.items if r.job == job], replay.truncated


def actions(
    job: JobOpt,
    nats_url: NatsOpt = None,
    limit: Annotated[int, typer.Option(min=1, help="Most records read")] = 10_000,
) -> None:
    """What the controller decided for a job, why, and the result (from ANTDT_ACTIONS)."""
    from antdt.runtime.bus import BusError

    quiet_logs()
    settings = client_settings(nats_url=nats_url)
    out = Console(width=None if Console().is_terminal else 200)
    try:
        records, truncated = asyncio.run(fetch_actions(settings.nats, job, limit))
    except BusError as exc:
        Console(stderr=True).print(f"[red]actions: {exc}[/]")
        raise typer.Exit(1) from None
    out.print(actions_table(job, records, truncated=truncated))
