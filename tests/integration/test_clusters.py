"""Three-node NATS (JetStream, R3 streams) and etcd clusters on loopback, one node of
each killed -9 mid-run: the clients, given every member, carry on and lose nothing."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.config import EtcdSettings, NatsSettings
from antdt.runtime.servers import EmbeddedEtcd, EmbeddedNats
from antdt.runtime.store import Store
from antdt.schemas import INCIDENT_STREAM, Subjects
from antdt.schemas.events import Incident

pytestmark = [pytest.mark.integration, pytest.mark.slow]

S = Subjects("antdt.cl")


def _ports(n: int) -> list[int]:
    """`n` distinct free ports (held together while chosen: free_port alone may return
    the same one twice before any server binds it)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _nats_cluster(root: Path, ports: list[int]) -> list[EmbeddedNats]:
    routes, clients, monitors = ports[0:3], ports[3:6], ports[6:9]
    nodes = []
    for i, route in enumerate(routes):
        others = [f"nats-route://127.0.0.1:{p}" for p in routes if p != route]
        cluster = {"name": "antdt", "listen": f"127.0.0.1:{route}", "routes": others}
        extra = f'server_name: "n{i}"\ncluster {json.dumps(cluster)}\n'
        node = EmbeddedNats(root / f"nats{i}", port=clients[i], monitor_port=monitors[i])
        node.extra_config = extra
        nodes.append(node)
    return nodes


def _etcd_cluster(root: Path, ports: list[int]) -> list[EmbeddedEtcd]:
    nodes = [
        EmbeddedEtcd(root / f"etcd{i}", port=ports[i], peer_port=ports[3 + i], name=f"e{i}")
        for i in range(3)
    ]
    initial = ",".join(f"{n.name}={n.peer_url}" for n in nodes)
    for node in nodes:
        node.initial_cluster = initial
    return nodes


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[tuple[list[EmbeddedNats], list[EmbeddedEtcd]]]:
    ports = _ports(15)
    nats, etcd = _nats_cluster(tmp_path, ports[:9]), _etcd_cluster(tmp_path, ports[9:])
    # Started together (an etcd member is ready only with a quorum), by threads that
    # outlive them: a server dies with the thread that started it (PR_SET_PDEATHSIG).
    pool = ThreadPoolExecutor(6)
    try:
        list(pool.map(lambda node: node.start(), [*etcd, *nats]))
        yield nats, etcd
    finally:
        for node in [*nats, *etcd]:
            node.stop()
        pool.shutdown()


def _incident(n: int) -> Incident:
    return Incident(
        id=f"i{n}",
        job="job",
        rank=0,
        host="h",
        kind="slow",
        state="opened",
        step=n,
        opened_at=1.0,
        updated_at=1.0,
        ratio=2.0,
        windows=1,
    )


async def test_one_node_of_each_cluster_killed_and_nothing_is_lost(clusters) -> None:
    nats, etcd = clusters
    url = ",".join(node.url for node in nats)
    endpoints = ",".join(node.endpoint for node in etcd)
    bus = Bus(NatsSettings(url=url, stream_replicas=3, subject_prefix="antdt.cl"), name="r3")
    store = Store(EtcdSettings(endpoint=endpoints, key_prefix="/antdt-cl/"))
    await bus.connect(retry_for_s=20)
    await store.connect(retry_for_s=20)
    try:
        for attempt in range(50):  # the JetStream meta leader is elected after start
            try:
                await bus.jetstream.ensure_stream(INCIDENT_STREAM, [S.any_job("incident")])
                break
            except Exception:
                if attempt == 49:
                    raise
                await asyncio.sleep(0.2)
        info = await bus.nc.jetstream().stream_info(INCIDENT_STREAM)
        assert info.config.num_replicas == 3
        for n in range(10):
            await bus.jetstream.publish(S.incident("job"), _incident(n), msg_id=f"i{n}")
            await store.put(store.key(f"k{n}"), str(n).encode())
        used = bus.nc.connected_url
        assert used is not None
        next(node for node in nats if node.port == used.port).kill()  # the one in use
        etcd[0].kill()  # the first endpoint: the one gRPC's pick_first uses
        for n in range(10, 20):
            await _retry(
                lambda n=n: bus.jetstream.publish(
                    S.incident("job"), _incident(n), msg_id=f"i{n}", timeout=2
                )
            )
            await _retry(lambda n=n: store.put(store.key(f"k{n}"), str(n).encode()))
        replay = await _retry(
            lambda: bus.jetstream.read(INCIDENT_STREAM, S.incident("job"), Incident)
        )
        assert [i.step for i in replay.items] == list(range(20))
        kept = await _retry(lambda: store.get_prefix(store.key("k")))
        assert sorted(int(v.value) for v in kept) == list(range(20))
    finally:
        await bus.close()
        await store.close()


async def _retry(call, attempts: int = 60):  # type: ignore[no-untyped-def]
    """A call across the failover (a new leader, a client moving to another member)."""
    for attempt in range(attempts):
        try:
            return await call()
        except Exception:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.25)
    return None
