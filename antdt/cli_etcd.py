"""What the CLI commands that read etcd directly share: the `--etcd-endpoint` option, the
settings it makes, and a store connected for one command."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated

import typer

from antdt.runtime.config import ServiceSettings

if TYPE_CHECKING:
    from antdt.runtime.store import Store

EtcdOpt = Annotated[
    str | None, typer.Option("--etcd-endpoint", help="etcd host:port (else ANTDT_ETCD__ENDPOINT)")
]


def etcd_settings(etcd_endpoint: str | None) -> ServiceSettings:
    """ANTDT_* settings, with the endpoint the command line gave, if any."""
    settings = ServiceSettings()
    if etcd_endpoint:
        settings.etcd.endpoint = etcd_endpoint
    return settings


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
