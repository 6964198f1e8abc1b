"""The commands that run services: one replica (`monitor`, `controller`; `shards` is
a group, see shards.py), all three in one process (`services`), or all three with
embedded servers (`up`)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from antdt.cli.options import EtcdOpt, MetricsOpt, NatsOpt

if TYPE_CHECKING:
    from antdt.runtime.loops import LoopKind
    from antdt.runtime.servers import EmbeddedCluster
    from antdt.runtime.servers.localauth import LocalAuth

ALL_SERVICES = ["monitor", "controller", "shards"]
SERVICE_USERS = frozenset(ALL_SERVICES)


def run_services(
    names: list[str],
    nats_url: str | None,
    etcd_endpoint: str | None,
    metrics: int | None,
    ready: Callable[[list[Any]], Awaitable[None]] | None = None,
    auth: LocalAuth | None = None,
) -> None:
    """Run `names` in this process until stopped: logs, the report's streams and the
    collector set up from the first one's settings, on the event loop they name. `auth`
    (a LocalAuth): each service connects as its own user."""
    from antdt.runtime.process import configure_gc
    from antdt.runtime.telemetry.logs import configure_logging
    from antdt.services.runner import run_services as run

    first = _service_settings(names[0], nats_url, etcd_endpoint, auth=auth)
    configure_logging(first.telemetry.log_level, first.telemetry.log_format)
    warn_unknown_settings()
    _ensure_recording(first)
    configure_gc(first.gc_thresholds)

    def settings_of(name: str) -> Any:
        return _service_settings(name, nats_url, etcd_endpoint, metrics, auth)

    until_stopped(run(names, settings_of, ready=ready), first.event_loop)


def until_stopped(services: Coroutine[Any, Any, None], event_loop: LoopKind) -> None:
    """Run `services` on `event_loop` until they stop: exit 1 when a failed task stopped
    them (logged as it failed), so that a supervisor restarts the process."""
    from antdt.runtime import loops
    from antdt.runtime.lifecycle import ServiceFailed

    try:
        loops.run(services, event_loop)
    except ServiceFailed:
        raise typer.Exit(1) from None


def _service_settings(
    name: str,
    nats_url: str | None,
    etcd_endpoint: str | None,
    metrics_port: int | None = None,
    auth: LocalAuth | None = None,
) -> Any:
    from antdt.services.runner import settings_class

    settings = settings_class(name)()
    if nats_url:
        settings.nats.url = nats_url
    if etcd_endpoint:
        settings.etcd.endpoint = etcd_endpoint
    if metrics_port is not None:
        settings.telemetry.metrics_port = metrics_port
    if auth is not None:
        settings.nats = auth.nats_as(settings.nats, name)
        settings.etcd = auth.etcd_as(settings.etcd, name)
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
    auth: Annotated[
        bool,
        typer.Option(
            help="NATS users per role and etcd users per service (--no-auth: open servers)"
        ),
    ] = True,
    job: Annotated[
        list[str] | None,
        typer.Option(help="A job whose agents get a NATS user (repeat for several)"),
    ] = None,
) -> None:
    """Start embedded nats-server (JetStream) and etcd plus the three services, in the
    foreground until Ctrl-C / SIGTERM; then stop everything, leaving no process behind.
    With auth (the default) every process connects as its role: env files to source are
    printed, one per role and per --job."""
    from antdt.runtime.servers import EmbeddedCluster

    cluster = EmbeddedCluster(root=data_dir, keep=data_dir is not None)
    local = _local_auth(cluster, job or []) if auth else None
    cluster.start()
    try:
        nats_url, etcd_endpoint = cluster.nats.url, cluster.etcd.endpoint
        files = _secure_etcd(local, nats_url, etcd_endpoint) if local else {}

        async def announce(_: list[Any]) -> None:
            console = Console(stderr=True)
            console.print(
                f"[bold green]AntDT up[/]  nats={nats_url}  etcd={etcd_endpoint}\n"
                f"  export ANTDT_NATS__URL={nats_url} ANTDT_ETCD__ENDPOINT={etcd_endpoint}"
            )
            for user, path in files.items():
                if user not in SERVICE_USERS:
                    console.print(f"  as {user}: source {path}")
            if local is not None and not local.jobs:
                console.print("  no agent user: restart with --job NAME for a job's ranks")
            console.print("  Ctrl-C to stop.")
            print(f"ANTDT_NATS__URL={nats_url}", flush=True)
            print(f"ANTDT_ETCD__ENDPOINT={etcd_endpoint}", flush=True)

        run_services(
            ALL_SERVICES, nats_url, etcd_endpoint, metrics_port, ready=announce, auth=local
        )
    finally:
        cluster.stop()


def _local_auth(cluster: EmbeddedCluster, jobs: list[str]) -> LocalAuth:
    """The credentials in the cluster's directory; nats-server's users from them."""
    from antdt.runtime.servers.localauth import LocalAuth

    assert cluster.root is not None  # made in its __post_init__
    local = LocalAuth.open(cluster.root / "auth", jobs)
    prefix = _service_settings("monitor", None, None).nats.subject_prefix
    cluster.nats.extra_config = local.nats_config(prefix)
    return local


def _secure_etcd(local: LocalAuth, nats_url: str, etcd_endpoint: str) -> dict[str, Path]:
    """Turn etcd's auth on, with a user per service limited to the key prefix (once per
    data directory); the env files of every user."""
    from antdt.runtime.servers.localauth import ETCD_ROOT, SERVICES
    from antdt.runtime.store import EtcdUser, enable_auth

    base = _service_settings("monitor", nats_url, etcd_endpoint)
    if not local.etcd_enabled:
        users = [EtcdUser(n, local.passwords[n], base.etcd.key_prefix) for n in SERVICES]
        asyncio.run(enable_auth(base.etcd, users, local.passwords[ETCD_ROOT]))
        local.etcd_enabled = True
        local.save()
    files: dict[str, Path] = local.env_files(base.nats, base.etcd)
    return files
