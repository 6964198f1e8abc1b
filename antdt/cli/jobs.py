"""`antdt jobs`: the jobs registered in etcd, live or ended, and who owns them (`list`);
`remove JOB` deletes an ended job's keys now instead of at the end of its retention
(the controller's `job_retention_s`). Reads etcd directly."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from antdt.cli.clients import client_settings, connected
from antdt.cli.options import EtcdOpt
from antdt.runtime.config import ServiceSettings
from antdt.schemas import JobSpec, Keys

jobs_app = typer.Typer(no_args_is_help=True, help=__doc__)
out = Console()
SERVICES = ("monitor", "controller", "shards")


@dataclass(frozen=True)
class JobRow:
    job: str
    spec: JobSpec | None  # None: unreadable
    ended_at: float | None  # None: live
    ended_step: int
    owners: dict[str, str]  # service -> replica
    finished: bool = True  # its data: ledger complete, or none
    abandoned: bool = False  # ended as abandoned: dormant, its next step revives it


def jobs_table(rows: list[JobRow], now: float, retention_s: float) -> Table:
    """The jobs as a rich table, live ones first, then by name. Pure."""
    live = sum(1 for r in rows if r.ended_at is None)
    table = Table(title=f"jobs: {live} live, {len(rows) - live} ended")
    for column in ("job", "state", "ranks", "policy", "dataset", "epochs", "owners"):
        table.add_column(column, overflow="fold")
    for r in sorted(rows, key=lambda row: (row.ended_at is not None, row.job)):
        spec = r.spec
        table.add_row(
            r.job,
            _state(r, now, retention_s),
            str(spec.world_size) if spec else "?",
            spec.policy if spec else "(spec unreadable)",
            f"{spec.dataset_size:,} / {spec.shard_size:,}" if spec else "",
            str(spec.epochs) if spec else "",
            " ".join(f"{s}={r.owners[s]}" for s in SERVICES if s in r.owners) or "-",
        )
    return table


def _state(row: JobRow, now: float, retention_s: float) -> Text:
    if row.ended_at is None:
        return Text("live", style="green")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(row.ended_at))
    text = f"{'abandoned' if row.abandoned else 'ended'} {when} at step {row.ended_step}"
    if row.abandoned:
        text += " (dormant: a step revives it)"
    if not row.finished:
        return Text(text + " (data unfinished: kept)", style="yellow")
    if retention_s > 0:
        left_h = max(0.0, row.ended_at + retention_s - now) / 3600
        text += f" (removed in {left_h:.0f}h)"
    return Text(text, style="dim")


async def read_jobs(settings: ServiceSettings) -> list[JobRow]:
    from pydantic import ValidationError

    from antdt.runtime.coordination.jobs import read_ended, scan_jobs

    keys = Keys(settings.etcd.key_prefix)
    async with connected(settings) as store:
        scanned = await scan_jobs(store, keys)
        ended = {r.job: r for r in await read_ended(store, keys, scanned.ended)}
        owners: dict[str, dict[str, str]] = {}
        for service in SERVICES:
            for item in await store.get_prefix(keys.owners(service)):
                job = item.key[len(keys.owners(service)) :]
                owners.setdefault(job, {})[service] = item.value.decode(errors="replace")
        rows = []
        for job in sorted(scanned.registered):
            stored = await store.get(keys.spec(job))
            try:
                spec = JobSpec.model_validate_json(stored.value) if stored else None
            except ValidationError:
                spec = None
            record = ended.get(job)
            rows.append(
                JobRow(
                    job,
                    spec,
                    ended_at=record.at if record else None,
                    ended_step=record.step if record else 0,
                    owners=owners.get(job, {}),
                    finished=record is None or record.finished is not False,
                    abandoned=job in scanned.dormant,
                )
            )
        return rows


async def remove_ended_job(settings: ServiceSettings, job: str) -> str | None:
    """Delete the ended `job`'s keys; None when done, else why not."""
    from antdt.runtime.coordination.jobs import read_ended, remove_job

    keys = Keys(settings.etcd.key_prefix)
    async with connected(settings) as store:
        if await store.get(keys.spec(job)) is None:
            return f"job {job} is not registered"
        records = await read_ended(store, keys, [job])
        if not records:
            return f"job {job} has not ended (its ranks have not all exited)"
        if not await remove_job(store, keys, records[0]):
            return f"job {job} was registered again meanwhile"
        return None


@jobs_app.command("list")
def list_command(
    etcd_endpoint: EtcdOpt = None,
    retention_s: Annotated[
        float,
        typer.Option(
            envvar="ANTDT_JOB_RETENTION_S",
            help="The controllers' job_retention_s (seconds; 0: kept), to show when ended jobs go",
        ),
    ] = 7 * 86400,
) -> None:
    """Every registered job: live or ended (when, at which step), its ranks, policy and
    dataset, and the replica of each service that owns it (ended jobs have none)."""
    settings = client_settings(etcd_endpoint=etcd_endpoint)
    try:
        rows = asyncio.run(read_jobs(settings))
    except Exception as exc:
        raise typer.BadParameter(f"cannot read etcd at {settings.etcd.endpoint}: {exc}") from None
    out.print(jobs_table(rows, time.time(), retention_s))


@jobs_app.command("remove")
def remove_command(
    job: Annotated[str, typer.Argument(help="An ended job")],
    etcd_endpoint: EtcdOpt = None,
) -> None:
    """Delete every key of an ended JOB now (spec, plan, ledger and its checkpoints,
    restart ledger, hellos). A live job is refused."""
    settings = client_settings(etcd_endpoint=etcd_endpoint)
    try:
        problem = asyncio.run(remove_ended_job(settings, job))
    except Exception as exc:
        raise typer.BadParameter(f"cannot reach etcd at {settings.etcd.endpoint}: {exc}") from None
    if problem is not None:
        Console(stderr=True).print(problem)
        raise typer.Exit(1)
    out.print(f"job {job} removed")
