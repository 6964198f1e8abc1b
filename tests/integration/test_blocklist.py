"""The host blocklist in etcd: a controller replica follows it and sweeps what expired
(never an entry renewed meanwhile); `antdt blocklist list` and `allow` read and change it."""

from __future__ import annotations

import asyncio
import time

import pytest
from typer.testing import CliRunner

from antdt.cli import app
from antdt.runtime.config import ServiceSettings
from antdt.runtime.store import Store
from antdt.schemas import BlocklistEntry, Keys
from antdt.services.controller.blocklist import Blocklist
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


def entry(host: str, until: float | None) -> bytes:
    return (
        BlocklistEntry(
            host=host,
            job="j",
            rank=1,
            action_id="j-restart-1",
            reason="slow",
            at=time.time() - 60,
            until=until,
        )
        .model_dump_json()
        .encode()
    )


async def test_a_replica_follows_the_blocklist_and_sweeps_only_what_expired(
    settings: ServiceSettings, store: Store
) -> None:
    keys, now = Keys(settings.etcd.key_prefix), time.time()
    await store.put(keys.blocklist("gone"), entry("gone", now - 1))
    await store.put(keys.blocklist("later"), entry("later", now + 3600))
    await store.put(keys.blocklist("forever"), entry("forever", None))
    blocklist = Blocklist()
    follower = asyncio.create_task(blocklist.follow(store, keys))
    try:
        await wait_for(lambda: len(blocklist.entries) == 3, what="entries followed")
        assert blocklist.hosts(time.time()) == {"later", "forever"}
        # "gone" is blocked again before the sweep runs: the sweep must keep it.
        stale = Blocklist()
        stale.entries = dict(blocklist.entries)
        await store.put(keys.blocklist("gone"), entry("gone", now + 3600))
        assert await stale.sweep(store, keys, time.time()) == []
        assert await store.get(keys.blocklist("gone")) is not None
        await wait_for(lambda: "gone" in blocklist.hosts(time.time()), what="renewal followed")
        # It expires for real: swept, and the watch drops it.
        await store.put(keys.blocklist("gone"), entry("gone", now - 1))
        await wait_for(lambda: "gone" not in blocklist.hosts(time.time()), what="expiry followed")
        assert await blocklist.sweep(store, keys, time.time()) == ["gone"]
        assert await store.get(keys.blocklist("gone")) is None
        await wait_for(lambda: "gone" not in blocklist.entries, what="deletion followed")
        assert blocklist.hosts(time.time()) == {"later", "forever"}
    finally:
        follower.cancel()


def test_the_cli_lists_the_blocklist_and_allows_a_host(settings: ServiceSettings) -> None:
    keys = Keys(settings.etcd.key_prefix)

    async def seed() -> None:
        store = await Store(settings.etcd).connect()
        await store.put(keys.blocklist("node-a"), entry("node-a", time.time() + 7200))
        await store.put(keys.blocklist("node-b"), b"by hand")
        await store.close()

    asyncio.run(seed())
    env = {
        "ANTDT_ETCD__ENDPOINT": settings.etcd.endpoint,
        "ANTDT_ETCD__KEY_PREFIX": settings.etcd.key_prefix,
        "COLUMNS": "200",
    }
    runner = CliRunner()
    listed = runner.invoke(app, ["blocklist", "list"], env=env)
    assert listed.exit_code == 0, listed.output
    assert "blocklist: 2 host(s)" in listed.output and "h59m left" in listed.output
    assert "node-b" in listed.output and "until allowed" in listed.output
    allowed = runner.invoke(app, ["blocklist", "allow", "node-a"], env=env)
    assert allowed.exit_code == 0 and "node-a allowed again" in allowed.output
    again = runner.invoke(app, ["blocklist", "allow", "node-a"], env=env)
    assert again.exit_code == 1
    listed = runner.invoke(app, ["blocklist", "list"], env=env)
    assert "blocklist: 1 host(s)" in listed.output and "node-a" not in listed.output
