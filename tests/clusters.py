"""Three-node NATS (JetStream) and etcd clusters on loopback ports, for tests that kill a
node of each mid-run: the nodes, started together, and the settings that name them all."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from antdt.runtime.config import EtcdSettings, NatsSettings
from antdt.runtime.servers import EmbeddedEtcd, EmbeddedNats

T = TypeVar("T")
LOOPBACK = "127.0.0.1"


def free_ports(n: int) -> list[int]:
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


def nats_cluster(
    root: Path, ports: list[int], host: str = LOOPBACK, netns: str | None = None
) -> list[EmbeddedNats]:
    """Three nats-server nodes routed to each other (9 ports: routes, clients, monitors),
    bound to `host` (in network namespace `netns`, None: this one)."""
    routes, clients, monitors = ports[0:3], ports[3:6], ports[6:9]
    nodes = []
    for i, route in enumerate(routes):
        others = [f"nats-route://{host}:{p}" for p in routes if p != route]
        cluster = {"name": "antdt", "listen": f"{host}:{route}", "routes": others}
        extra = f'server_name: "n{i}"\ncluster {json.dumps(cluster)}\n'
        node = EmbeddedNats(
            root / f"nats{i}", port=clients[i], monitor_port=monitors[i], host=host, netns=netns
        )
        node.extra_config = extra
        nodes.append(node)
    return nodes


def etcd_cluster(
    root: Path, ports: list[int], host: str = LOOPBACK, netns: str | None = None
) -> list[EmbeddedEtcd]:
    """Three etcd members of one cluster (6 ports: clients, peers), bound to `host`."""
    nodes = [
        EmbeddedEtcd(
            root / f"etcd{i}",
            port=ports[i],
            peer_port=ports[3 + i],
            name=f"e{i}",
            host=host,
            netns=netns,
        )
        for i in range(3)
    ]
    initial = ",".join(f"{n.name}={n.peer_url}" for n in nodes)
    for node in nodes:
        node.initial_cluster = initial
    return nodes


@dataclass(frozen=True)
class Clusters:
    nats: list[EmbeddedNats]
    etcd: list[EmbeddedEtcd]

    def nats_settings(self, prefix: str) -> NatsSettings:
        """Every node's URL, streams replicated on all three (R3)."""
        url = ",".join(node.url for node in self.nats)
        return NatsSettings(url=url, stream_replicas=3, subject_prefix=prefix)

    def etcd_settings(self, key_prefix: str, **fields: object) -> EtcdSettings:
        endpoints = ",".join(node.endpoint for node in self.etcd)
        return EtcdSettings(endpoint=endpoints, key_prefix=key_prefix, **fields)  # type: ignore[arg-type]


@contextmanager
def running_clusters(
    root: Path, host: str = LOOPBACK, netns: str | None = None
) -> Iterator[Clusters]:
    """Both clusters, up until the block ends; bound to `host` in `netns` (a namespace
    host's address: every port is free there, the ports picked here serve as well)."""
    ports = free_ports(15)
    nats, etcd = (
        nats_cluster(root, ports[:9], host, netns),
        etcd_cluster(root, ports[9:], host, netns),
    )
    # Started together (an etcd member is ready only with a quorum), by threads that
    # outlive them: a server dies with the thread that started it (PR_SET_PDEATHSIG).
    pool = ThreadPoolExecutor(6)
    try:
        list(pool.map(lambda node: node.start(), [*etcd, *nats]))
        yield Clusters(nats, etcd)
    finally:
        for node in [*nats, *etcd]:
            node.stop()
        pool.shutdown()


async def retry(call: Callable[[], Awaitable[T]], attempts: int = 60, pause: float = 0.25) -> T:
    """A call across a failover or an election (a new leader, a client moving to another
    member): tried `attempts` times, the last error raised."""
    for _ in range(attempts - 1):
        try:
            return await call()
        except Exception:
            await asyncio.sleep(pause)
    return await call()
