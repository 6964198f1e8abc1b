"""`antdt status` and `antdt report`: one job's run, live or as recorded."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from antdt.cli.clients import client_settings, quiet_logs
from antdt.cli.options import JobOpt, NatsOpt


def status(
    job: JobOpt,
    nats_url: NatsOpt = None,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit")] = False,
    refresh: Annotated[float, typer.Option(min=0.1, help="Redraw period, seconds")] = 1.0,
) -> None:
    """Live view of a job: per-rank speed and class, plan, open incidents, recent actions,
    balance efficiency. Ctrl-C to leave."""
    from antdt.observe import run_status
    from antdt.runtime.bus import BusError

    settings = client_settings(nats_url=nats_url)
    quiet_logs()
    try:
        out = Console(width=None if Console().is_terminal else 160)  # a file has no width
        asyncio.run(run_status(settings.nats, job, once=once, refresh_s=refresh, console=out))
    except KeyboardInterrupt:
        pass
    except BusError as exc:
        Console(stderr=True).print(f"[red]status: {exc}[/]")
        raise typer.Exit(1) from None


def report(
    job: JobOpt,
    out: Annotated[Path, typer.Option(help="Directory for JOB.png and JOB.html")] = Path(
        "runs/report"
    ),
    nats_url: NatsOpt = None,
    limit: Annotated[int, typer.Option(min=1, help="Messages read per source")] = 200_000,
) -> None:
    """Draw a run from what JetStream recorded: per-rank step times over steps with
    incidents and actions marked, and balance efficiency; writes a PNG and an HTML file."""
    from antdt.observe import ReportEmpty, report_job
    from antdt.runtime.bus import BusError

    settings = client_settings(nats_url=nats_url)
    quiet_logs()
    console = Console(stderr=True)
    if importlib.util.find_spec("matplotlib") is None:  # said before the read, not after
        console.print("[red]report: matplotlib is not installed: pip install 'antdt\\[report]'[/]")
        raise typer.Exit(2)
    try:
        files = asyncio.run(report_job(settings.nats, job, out, console=console, limit=limit))
    except (BusError, ReportEmpty, OSError) as exc:  # OSError: --out not writable
        console.print(f"[red]report: {exc}[/]")
        raise typer.Exit(1) from None
    for note in files.timeline.notes:
        console.print(f"[yellow]note: {note}[/]")
    print(files.png)
    print(files.html)
