"""The `antdt` command."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from antdt.cli_actions import actions
from antdt.cli_blocklist import blocklist_app
from antdt.cli_jobs import jobs_app
from antdt.cli_shards import shards_app

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
schemas_app = typer.Typer(no_args_is_help=True, help="The wire contract.")
app.add_typer(schemas_app, name="schemas")
app.add_typer(shards_app, name="shards")
app.add_typer(blocklist_app, name="blocklist")
app.add_typer(jobs_app, name="jobs")
app.command()(actions)
console = Console(stderr=True)

NatsOpt = Annotated[str | None, typer.Option("--nats-url", help="NATS URL (else ANTDT_NATS__URL)")]
EtcdOpt = Annotated[
    str | None, typer.Option("--etcd-endpoint", help="etcd host:port (else ANTDT_ETCD__ENDPOINT)")
]
MetricsOpt = Annotated[
    int | None,
    typer.Option(
        "--metrics-port", help="Serve Prometheus /metrics here (else ANTDT_TELEMETRY__METRICS_PORT)"
    ),
]


def _service_settings(
    name: str, nats_url: str | None, etcd_endpoint: str | None, metrics_port: int | None = None
) -> Any:
    from antdt.services.runner import settings_class

    settings = settings_class(name)()
    if nats_url:
        settings.nats.url = nats_url
    if etcd_endpoint:
        settings.etcd.endpoint = etcd_endpoint
    if metrics_port is not None:
        settings.telemetry.metrics_port = metrics_port
    return settings


def _configure_logs(settings: Any) -> None:
    from antdt.runtime.telemetry.logs import configure_logging

    configure_logging(settings.telemetry.log_level, settings.telemetry.log_format)


def _run_services(
    names: list[str],
    nats_url: str | None,
    etcd_endpoint: str | None,
    metrics: int | None,
    ready: Callable[[list[Any]], Awaitable[None]] | None = None,
) -> None:
    """Run `names` in this process until stopped: logs, the report's streams and the
    collector set up from the first one's settings, on the event loop they name."""
    from antdt.runtime import loops
    from antdt.runtime.process import configure_gc
    from antdt.services.runner import run_services

    first = _service_settings(names[0], nats_url, etcd_endpoint)
    _configure_logs(first)
    _warn_unknown_settings()
    _ensure_recording(first)
    configure_gc(first.gc_thresholds)

    def settings_of(name: str) -> Any:
        return _service_settings(name, nats_url, etcd_endpoint, metrics)

    loops.run(run_services(names, settings_of, ready=ready), first.event_loop)


def _warn_unknown_settings() -> None:
    """Name the `ANTDT_*` variables that no service (nor an agent) has as a setting: they
    are ignored, and a misspelt endpoint would otherwise fall back to its default."""
    import structlog
    from pydantic import BaseModel

    from antdt.agent.settings import AgentSettings
    from antdt.runtime.config import unknown_settings
    from antdt.services.runner import SERVICE_NAMES, settings_class

    roots: list[type[BaseModel]] = [settings_class(name) for name in SERVICE_NAMES]
    roots.append(AgentSettings)
    unknown = unknown_settings(os.environ, roots)
    if unknown:
        structlog.get_logger("antdt").warning(
            "environment variables that are no setting: ignored", variables=unknown,
            settings="`antdt monitor|controller|shards --help`, docs/architecture.md",
        )  # fmt: skip


def _ensure_recording(settings: Any) -> None:
    """The bounded streams `antdt report` reads (ANTDT_STEPS, ANTDT_HEALTH). Idempotent, so
    every replica does it; a failure is logged and the services start anyway."""
    import structlog

    from antdt.observe import ensure_recording_at

    try:
        asyncio.run(ensure_recording_at(settings.nats, settings.recording))
    except Exception as exc:
        structlog.get_logger("antdt.recorder").warning("recording off", error=str(exc))


@app.command()
def monitor(
    nats_url: NatsOpt = None, etcd_endpoint: EtcdOpt = None, metrics_port: MetricsOpt = None
) -> None:
    """Run one Monitor replica against the given NATS and etcd."""
    _run_services(["monitor"], nats_url, etcd_endpoint, metrics_port)


@app.command()
def controller(
    nats_url: NatsOpt = None, etcd_endpoint: EtcdOpt = None, metrics_port: MetricsOpt = None
) -> None:
    """Run one Controller replica against the given NATS and etcd."""
    _run_services(["controller"], nats_url, etcd_endpoint, metrics_port)


@app.command()
def services(
    nats_url: NatsOpt = None, etcd_endpoint: EtcdOpt = None, metrics_port: MetricsOpt = None
) -> None:
    """Run all three services in one process against the given NATS and etcd."""
    _run_services(["monitor", "controller", "shards"], nats_url, etcd_endpoint, metrics_port)


@app.command()
def up(
    data_dir: Annotated[
        Path | None, typer.Option(help="Keep server data here (default: a temp dir)")
    ] = None,
    metrics_port: MetricsOpt = None,
) -> None:
    """Start embedded nats-server (JetStream) and etcd plus the three services, in the
    foreground until Ctrl-C / SIGTERM; then stop everything, leaving no process behind."""
    from antdt.runtime.servers import EmbeddedCluster

    cluster = EmbeddedCluster(root=data_dir, keep=data_dir is not None).start()
    try:
        nats_url, etcd_endpoint = cluster.nats.url, cluster.etcd.endpoint

        async def announce(_: list[Any]) -> None:
            console.print(
                f"[bold green]AntDT up[/]  nats={nats_url}  etcd={etcd_endpoint}\n"
                f"  export ANTDT_NATS__URL={nats_url} ANTDT_ETCD__ENDPOINT={etcd_endpoint}\n"
                "  Ctrl-C to stop."
            )
            print(f"ANTDT_NATS__URL={nats_url}", flush=True)
            print(f"ANTDT_ETCD__ENDPOINT={etcd_endpoint}", flush=True)

        _run_services(["monitor", "controller", "shards"], nats_url, etcd_endpoint,
                      metrics_port, ready=announce)  # fmt: skip
    finally:
        cluster.stop()


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def launch(
    ctx: typer.Context,
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="Ranks to start")] = 2,
    max_restarts: Annotated[
        int, typer.Option("--max-restarts", min=0, help="Group restarts after a rank fails")
    ] = 0,
    spare_slots: Annotated[
        int, typer.Option("--spare-slots", min=0, help="Spare host slots for KILL_RESTART")
    ] = 0,
) -> None:
    """Start N local ranks (gloo on CPU): `antdt launch --nproc 4 -- python train.py`.
    With --max-restarts, a failed group is started again (ANTDT_RESTART_COUNT=k) to
    resume from its checkpoint."""
    from antdt.agent.launch import launch as run_ranks

    command = [a for a in ctx.args if a != "--"]
    if not command:
        raise typer.BadParameter("give the command after --, e.g. -- python train.py")
    code = run_ranks(
        nproc, command, env=dict(os.environ), max_restarts=max_restarts, spare_slots=spare_slots
    )
    raise typer.Exit(code)


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Where results go")] = Path("runs/demo"),
    steps: Annotated[int, typer.Option(help="Training steps per run")] = 150,
) -> None:
    """Train a real model twice (policy none, then lb-bsp) with a 3x-slow rank, and show
    what AntDT did."""
    from antdt.demo.run import run_demo

    raise typer.Exit(run_demo(out, steps=steps))


JobOpt = Annotated[str, typer.Option("--job", help="Job id")]


def _client_settings(nats_url: str | None) -> Any:
    """Settings of a client command (prefix, URL) from ANTDT_* and --nats-url; logs quiet."""
    from antdt.runtime.config import ServiceSettings
    from antdt.runtime.telemetry.logs import configure_logging

    settings = ServiceSettings()
    if nats_url:
        settings.nats.url = nats_url
    configure_logging("warning", "console")
    return settings


@app.command()
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

    settings = _client_settings(nats_url)
    try:
        out = Console(width=None if Console().is_terminal else 160)  # a file has no width
        asyncio.run(run_status(settings.nats, job, once=once, refresh_s=refresh, console=out))
    except KeyboardInterrupt:
        pass
    except BusError as exc:
        console.print(f"[red]status: {exc}[/]")
        raise typer.Exit(1) from None


@app.command()
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

    settings = _client_settings(nats_url)
    try:
        files = asyncio.run(report_job(settings.nats, job, out, console=console, limit=limit))
    except (BusError, ReportEmpty) as exc:
        console.print(f"[red]report: {exc}[/]")
        raise typer.Exit(1) from None
    for note in files.timeline.notes:
        console.print(f"[yellow]note: {note}[/]")
    print(files.png)
    print(files.html)


@schemas_app.command("export")
def schemas_export(directory: Path) -> None:
    """Write the JSON Schema of every wire message into DIRECTORY."""
    from antdt.schemas.export import export_schemas

    for path in export_schemas(directory):
        console.print(f"wrote {path}")


def main() -> None:
    app(prog_name="antdt")


if __name__ == "__main__":
    main()
