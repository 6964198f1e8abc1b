"""Run one service process: settings → logs and tracing → bus and store → service → wait
for the stop signal → staged shutdown. This is what `antdt monitor|controller|shards`
(and compose/Nomad) run; `antdt up` runs all three in one process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.runtime.lifecycle import ServiceFailed, ServiceRuntime
from antdt.runtime.store import Store
from antdt.runtime.telemetry import (
    Health,
    Readiness,
    flush_tracing,
    setup_metrics,
    setup_tracing,
)

SERVICE_NAMES = ("monitor", "controller", "shards")


def settings_class(name: str) -> type[ServiceSettings]:
    if name == "monitor":
        from antdt.services.monitor.service import MonitorSettings

        return MonitorSettings
    if name == "controller":
        from antdt.services.controller.service import ControllerSettings

        return ControllerSettings
    if name == "shards":
        from antdt.services.shards.service import ShardsSettings

        return ShardsSettings
    raise ValueError(f"unknown service {name!r}; one of {SERVICE_NAMES}")


def _service(name: str, settings: Any, bus: Bus, store: Store) -> Any:
    if name == "monitor":
        from antdt.services.monitor.service import MonitorService

        return MonitorService(settings, bus, store)
    if name == "controller":
        from antdt.services.controller.service import ControllerService

        return ControllerService(settings, bus, store)
    from antdt.services.shards.service import ShardsService

    return ShardsService(settings, bus, store)


async def start_service(name: str, settings: ServiceSettings, runtime: ServiceRuntime) -> Any:
    """Connect and start one service on `runtime`; returns the service object."""
    wait_s = settings.wait_for_servers_s
    bus = Bus(settings.nats, name=f"antdt-{name}-{settings.replica_id}")
    await bus.connect(retry_for_s=wait_s)
    store = await Store(settings.etcd).connect(retry_for_s=wait_s)
    service = _service(name, settings, bus, store)
    await service.start(runtime)
    runtime.on_shutdown("flush", bus.close)
    runtime.on_shutdown("flush", store.close)
    return service


async def run_services(
    names: list[str],
    settings_for: Callable[[str], ServiceSettings],
    *,
    ready: Callable[[list[Any]], Awaitable[None]] | None = None,
) -> None:
    """Run services in this process until SIGINT/SIGTERM, then shut down in stages."""
    runtime, health = ServiceRuntime("+".join(names)), Health()
    first = settings_for(names[0])
    telemetry, service_name = first.telemetry, "antdt-" + "-".join(names)
    provider = setup_tracing(service_name, telemetry.otlp_endpoint)
    runtime.on_shutdown("flush", lambda: asyncio.to_thread(flush_tracing, provider))
    exported = setup_metrics(
        service_name,
        port=telemetry.metrics_port,
        host=telemetry.metrics_host,
        otlp_endpoint=telemetry.metrics_otlp_endpoint,
        interval_s=telemetry.metrics_interval_s,
        health=health,
    )
    if exported is not None:
        runtime.on_shutdown("flush", lambda: asyncio.to_thread(exported.flush))
    runtime.install_signal_handlers()
    runtime.spawn("heartbeat", _heartbeat(health))
    runtime.on_shutdown("drain", lambda: _stopping(health))  # not ready while it stops
    try:
        services = [await start_service(n, settings_for(n), runtime) for n in names]
        health.move(Readiness.READY)
        if ready is not None:
            await ready(services)
    except BaseException:
        await runtime.shutdown()
        raise
    await runtime.run()
    if runtime.failure is not None:
        raise ServiceFailed(runtime.failure)


async def _stopping(health: Health) -> None:
    health.move(Readiness.STOPPING)


async def _heartbeat(health: Health, every_s: float = 1.0) -> None:
    """Beat while the event loop turns: /livez fails once it has stopped turning."""
    while True:
        health.beat(time.monotonic())
        await asyncio.sleep(every_s)
