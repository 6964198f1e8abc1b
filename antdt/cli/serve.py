"""The commands that run services: one replica (`monitor`, `controller`; `shards` is
a group, see shards.py), all three in one process (`services`), or all three with
embedded servers (`up`)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from antdt.cli.options import EtcdOpt, MetricsOpt, NatsOpt

ALL_SERVICES = ["monitor", "controller", "shards"]


def run_services(
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
    from antdt.runtime.telemetry.logs import configure_logging
    from antdt.services.runner import run_services as run

    first = _service_settings(names[0], nats_url, etcd_endpoint)
    configure_logging(first.telemetry.log_level, first.telemetry.log_format)
    warn_unknown_settings()
    _ensure_recording(first)
    configure_gc(first.gc_thresholds)

    def settings_of(name: str) -> Any:
        return _service_settings(name, nats_url, etcd_endpoint, metrics)

    loops.run(run(names, settings_of, ready=ready), first.event_loop)


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


def warn_unknown_settings() -> None:
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
            "environment variables that are no setting: ignored",
            variables=unknown,
            settings="`antdt monitor|controller|shards --help`, docs/architecture.md",
        )


def _ensure_recording(settings: Any) -> None:
    """The bounded streams `antdt report` reads (ANTDT_STEPS, ANTDT_HEALTH). Idempotent, so
    every replica does it; a failure is logged and the services start anyway."""
    import structlog

    from antdt.observe import ensure_recording_at

    try:
        asyncio.run(ensure_recording_at(settings.nats, settings.recording))
    except Exception as exc:
        structlog.get_logger("antdt.recorder").warning("recording off", error=str(exc))


def monitor(
    nats_url: NatsOpt = None, etcd_endpoint: EtcdOpt = None, metrics_port: MetricsOpt = None
) -> None:
    """Run one Monitor replica against the given NATS and etcd."""
    run_services(["monitor"], nats_url, etcd_endpoint, metrics_port)


def controller(
    nats_url: NatsOpt = None, etcd_endpoint: EtcdOpt = None, metrics_port: MetricsOpt = None
) -> None:
    """Run one Controller replica against the given NATS and etcd."""
    run_services(["controller"], nats_url, etcd_endpoint, metrics_port)


def services(
    nats_url: NatsOpt = None, etcd_endpoint: EtcdOpt = None, metrics_port: MetricsOpt = None
) -> None:
    """Run all three services in one process against the given NATS and etcd."""

    async def announce(_: list[Any]) -> None:
        Console(stderr=True).print(f"AntDT services ready: {', '.join(ALL_SERVICES)}")

    run_services(ALL_SERVICES, nats_url, etcd_endpoint, metrics_port, ready=announce)


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
            Console(stderr=True).print(
                f"[bold green]AntDT up[/]  nats={nats_url}  etcd={etcd_endpoint}\n"
                f"  export ANTDT_NATS__URL={nats_url} ANTDT_ETCD__ENDPOINT={etcd_endpoint}\n"
                "  Ctrl-C to stop."
            )
            print(f"ANTDT_NATS__URL={nats_url}", flush=True)
            print(f"ANTDT_ETCD__ENDPOINT={etcd_endpoint}", flush=True)

        run_services(ALL_SERVICES, nats_url, etcd_endpoint, metrics_port, ready=announce)
    finally:
        cluster.stop()
