"""Services started before NATS and etcd exist wait for them (with backoff, for as long
as it takes) and come up when they appear."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.config import EtcdSettings, NatsSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.servers import EmbeddedEtcd, EmbeddedNats, free_port
from antdt.runtime.store import Store
from antdt.schemas import ShardStatusRequest, Subjects
from antdt.services.runner import start_service
from antdt.services.shards.service import ShardsSettings

pytestmark = pytest.mark.integration


def _servers(root: Path) -> tuple[EmbeddedNats, EmbeddedEtcd]:
    """Servers not started yet, on ports chosen now (the clients point there first)."""
    nats = EmbeddedNats(root / "nats", port=free_port(), monitor_port=free_port())
    etcd = EmbeddedEtcd(root / "etcd", port=free_port(), peer_port=free_port())
    return nats, etcd


async def test_the_bus_and_store_wait_for_servers_that_come_later(tmp_path: Path) -> None:
    nats, etcd = _servers(tmp_path)
    bus = Bus(NatsSettings(url=nats.url, backoff_max_s=0.5), name="early")
    store = Store(EtcdSettings(endpoint=etcd.endpoint, backoff_max_s=0.5))
    waiting = asyncio.gather(bus.connect(retry_for_s=None), store.connect(retry_for_s=None))
    await asyncio.sleep(2)
    assert not waiting.done()
    await asyncio.to_thread(etcd.start)
    await asyncio.to_thread(nats.start)
    try:
        await asyncio.wait_for(waiting, 20)
        await store.put(store.key("k"), b"v")
        assert await bus.rtt() > 0
    finally:
        await bus.close()
        await store.close()
        nats.stop()
        etcd.stop()


async def test_a_client_with_a_deadline_still_gives_up(tmp_path: Path) -> None:
    nats, etcd = _servers(tmp_path)
    with pytest.raises(Exception, match=r"cannot connect to NATS .* in 1\.0s"):
        await Bus(NatsSettings(url=nats.url), name="late").connect(retry_for_s=1.0)
    with pytest.raises(Exception, match="cannot reach etcd"):
        await Store(EtcdSettings(endpoint=etcd.endpoint)).connect(retry_for_s=1.0)


# A minute of waiting for servers: `make test-long`, beside the other runs of minutes.
@pytest.mark.parametrize(
    "gap_s", [2.0, pytest.param(60.0, marks=[pytest.mark.slow, pytest.mark.long])]
)
async def test_a_service_started_before_its_servers_comes_up(tmp_path: Path, gap_s: float) -> None:
    nats, etcd = _servers(tmp_path)
    prefix = "antdt.order"
    settings = ShardsSettings(
        nats=NatsSettings(url=nats.url, subject_prefix=prefix),
        etcd=EtcdSettings(endpoint=etcd.endpoint, key_prefix="/antdt-order/"),
        replica_id="early-shards",
    )
    runtime = ServiceRuntime("shards")
    starting = asyncio.ensure_future(start_service("shards", settings, runtime))
    await asyncio.sleep(gap_s)
    assert not starting.done()
    await asyncio.to_thread(nats.start)
    await asyncio.sleep(min(gap_s, 5))  # NATS up, etcd still not: the service waits on
    assert not starting.done()
    await asyncio.to_thread(etcd.start)
    client = Bus(NatsSettings(url=nats.url, subject_prefix=prefix), name="client")
    try:
        await asyncio.wait_for(starting, 30)
        await client.connect()
        subject = Subjects(prefix).shards("j1", "status")
        reply = await client.request_raw(
            subject, ShardStatusRequest(job="j1").model_dump_json().encode(), timeout=5
        )
        assert reply  # answered (a status or an error saying the job is unknown)
    finally:
        await client.close()
        await runtime.shutdown()
        nats.stop()
        etcd.stop()


async def test_clients_take_lists_of_servers_and_use_one_that_answers(cluster) -> None:
    """A cluster's members as lists: the first named is down, the client uses the next."""
    dead = f"127.0.0.1:{free_port()}"
    bus = Bus(NatsSettings(url=f"nats://{dead},{cluster.nats.url}"), name="list")
    store = Store(EtcdSettings(endpoint=f"{dead},{cluster.etcd.endpoint}", key_prefix="/lst/"))
    try:
        await bus.connect(retry_for_s=10)
        await store.connect(retry_for_s=10)
        assert await bus.rtt() > 0
        await store.put(store.key("k"), b"v")
        got = await store.get(store.key("k"))
        assert got is not None and got.value == b"v"
    finally:
        await bus.close()
        await store.close()
