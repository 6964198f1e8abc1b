"""What the one-shot commands (they ask the services or etcd, then exit) share: their
settings, a store connected for one command, and quiet logs."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from antdt.runtime.config import ServiceSettings

if TYPE_CHECKING:
    from antdt.runtime.store import Store


def client_settings(
    *, nats_url: str | None = None, etcd_endpoint: str | None = None
) -> ServiceSettings:
    """ANTDT_* settings, with the URL and endpoint the command line gave, if any."""
    settings = ServiceSettings()
    if nats_url:
        settings.nats.url = nats_url
    if etcd_endpoint:
        settings.etcd.endpoint = etcd_endpoint
    return settings


def quiet_logs() -> None:
    """Warnings and errors only, for people: a command prints its own answer."""
    from antdt.runtime.telemetry.logs import configure_logging

    configure_logging("warning", "console")


@contextlib.asynccontextmanager
async def connected(settings: ServiceSettings) -> AsyncIterator[Store]:
    """A store for one command (imported here: the etcd client is slow to import, and
    most commands never need it)."""
    from antdt.runtime.store import Store

    store = await Store(settings.etcd).connect(retry_for_s=5.0)
    try:
        yield store
    finally:
        await store.close()
