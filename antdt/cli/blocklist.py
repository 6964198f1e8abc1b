"""`antdt blocklist`: the hosts that KILL_RESTART moved ranks off, and until when they are
avoided (`list`); `allow HOST` takes one off at once. Reads and writes `blocklist/` in
etcd directly (every controller replica follows it with a watch)."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from antdt.cli.clients import client_settings, connected
from antdt.cli.options import EtcdOpt
from antdt.runtime.config import ServiceSettings
from antdt.schemas import BlocklistEntry, Keys

blocklist_app = typer.Typer(no_args_is_help=True, help=__doc__)
out = Console()
#: One row: the host, and its entry (None: a value that is not a BlocklistEntry).
Row = tuple[str, BlocklistEntry | None]


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _left(entry: BlocklistEntry | None, now: float) -> Text:
    if entry is None or entry.until is None:
        return Text("until allowed", style="red")
    if now >= entry.until:
        return Text(f"expired {_when(entry.until)}", style="dim")
    hours, seconds = divmod(int(entry.until - now), 3600)
    return Text(f"{_when(entry.until)} ({hours}h{seconds // 60:02d}m left)", style="yellow")


def blocklist_table(rows: list[Row], now: float) -> Table:
    """The blocklist as a rich table, hosts sorted. Pure."""
    table = Table(title=f"blocklist: {len(rows)} host(s)")
    for column in ("host", "avoided until", "since", "job", "rank", "action", "reason"):
        table.add_column(column, overflow="fold")
    for host, e in sorted(rows, key=lambda row: row[0]):
        if e is None:
            table.add_row(host, _left(None, now), "", "", "", "", "(not a BlocklistEntry)")
            continue
        table.add_row(host, _left(e, now), _when(e.at), e.job, str(e.rank), e.action_id, e.reason)
    return table


async def read_blocklist(settings: ServiceSettings) -> list[Row]:
    from pydantic import ValidationError

    keys = Keys(settings.etcd.key_prefix)
    async with connected(settings) as store:
        items = await store.get_prefix(keys.blocklists())
    rows: list[Row] = []
    for item in items:
        host = keys.host_of_blocklist_key(item.key)
        if host is None:
            continue
        try:
            rows.append((host, BlocklistEntry.model_validate_json(item.value)))
        except ValidationError:
            rows.append((host, None))
    return rows


async def allow_host(settings: ServiceSettings, host: str) -> bool:
    """Delete `blocklist/{host}`; False if it was not there."""
    async with connected(settings) as store:
        return await store.delete(Keys(settings.etcd.key_prefix).blocklist(host))


@blocklist_app.command("list")
def list_command(etcd_endpoint: EtcdOpt = None) -> None:
    """Every blocklisted host: until when, since when, and the restart that put it there."""
    settings = client_settings(etcd_endpoint=etcd_endpoint)
    try:
        rows = asyncio.run(read_blocklist(settings))
    except Exception as exc:
        raise typer.BadParameter(f"cannot read etcd at {settings.etcd.endpoint}: {exc}") from None
    out.print(blocklist_table(rows, time.time()))


@blocklist_app.command("allow")
def allow_command(
    host: Annotated[str, typer.Argument(help="The host to allow again")],
    etcd_endpoint: EtcdOpt = None,
) -> None:
    """Take HOST off the blocklist now: restarts may place ranks on it again."""
    settings = client_settings(etcd_endpoint=etcd_endpoint)
    try:
        removed = asyncio.run(allow_host(settings, host))
    except Exception as exc:
        raise typer.BadParameter(f"cannot reach etcd at {settings.etcd.endpoint}: {exc}") from None
    if not removed:
        Console(stderr=True).print(f"host {host} is not on the blocklist")
        raise typer.Exit(1)
    out.print(f"host {host} allowed again")
