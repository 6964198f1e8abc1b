"""The shards ledger's size as stored in etcd, against shard size, with what encoding
and decoding it costs."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from antdt.runtime.bus import Bus
from antdt.runtime.config import EtcdSettings
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store
from antdt.schemas import (
    JobSpec,
    Keys,
    ShardFetch,
    ShardGrant,
    ShardReply,
)

#: Numbers the cycles benches' jobs, so that no run takes up an earlier one's ledger.
from bench.display import console
from bench.replicas import ShardsReplicas


async def bench_ledger_size(
    replicas: ShardsReplicas,
    store: Store,
    *,
    dataset_size: int,
    shard_size: int,
    ranks: int,
    prefetch: int,
) -> dict[str, float]:
    """Bytes of the ledger stored in etcd once each of `ranks` ranks holds `prefetch`
    shards (granted through the service, as in a running job, reservations included: at
    this many ranks MAX_RESERVED leaves none), the fetch rate while
    filling it, and what one commit's encoding and one reload's decoding of it cost."""
    job = f"size{dataset_size}x{shard_size}"
    spec = JobSpec(
        job=job,
        world_size=ranks,
        dataset_size=dataset_size,
        shard_size=shard_size,
        global_batch=ranks * 32,
    )
    await replicas.register(store, spec)
    client = await Bus(replicas.nats, name="bench-size").connect()
    try:
        _, fetches_per_s = await grant_every_rank(client, replicas, job, ranks, prefetch)
    finally:
        await client.close()
    stored = await stored_ledger(store, replicas, job)
    return {
        "bytes": len(stored),
        "in_flight": ranks * prefetch,
        "fetches_per_s": fetches_per_s,
        **_codec_ms(stored),
    }


async def grant_every_rank(
    bus: Bus, replicas: ShardsReplicas, job: str, ranks: int, prefetch: int, concurrent: int = 64
) -> tuple[dict[int, tuple[ShardGrant, ...]], float]:
    """Each of `ranks` ranks asks for `prefetch` shards, `concurrent` requests at a time,
    as a job's ranks do at its start: their grants by rank, and the fetches per second."""
    subject = replicas.subjects.shards(job, "fetch")
    gate = asyncio.Semaphore(concurrent)
    held: dict[int, tuple[ShardGrant, ...]] = {}

    async def fetch(rank: int) -> None:
        async with gate:
            request = ShardFetch(job=job, rank=rank, epoch=0, want=prefetch, held=())
            held[rank] = (await bus.request(subject, request, ShardReply, timeout=60)).grants

    started = time.perf_counter()
    await asyncio.gather(*(fetch(r) for r in range(ranks)))
    return held, ranks / (time.perf_counter() - started)


async def stored_ledger(store: Store, replicas: ShardsReplicas, job: str) -> bytes:
    """The job's ledger as stored in etcd."""
    stored = await store.get(Keys(replicas.key_prefix).ledger(job))
    if stored is None:
        raise RuntimeError(f"no ledger stored for {job}")
    return stored.value


def _codec_ms(value: bytes) -> dict[str, float]:
    from antdt.services.shards.ledger import LedgerState
    from antdt.services.shards.ops import encode

    started = time.perf_counter()
    state = LedgerState.model_validate_json(value)
    decoded = time.perf_counter()
    encode(state)
    return {
        "decode_ms": (decoded - started) * 1000,
        "encode_ms": (time.perf_counter() - decoded) * 1000,
    }


async def bench_ledger_sizes(
    cluster: EmbeddedCluster,
    *,
    dataset_size: int,
    shard_sizes: tuple[int, ...],
    ranks: int,
    prefetch: int,
) -> dict[int, dict[str, float]]:
    """bench_ledger_size for each shard size, against one replica process."""
    store = await Store(EtcdSettings(endpoint=cluster.etcd.endpoint)).connect()
    try:
        async with ShardsReplicas(cluster, count=1) as running:
            return {
                size: await bench_ledger_size(
                    running,
                    store,
                    dataset_size=dataset_size,
                    shard_size=size,
                    ranks=ranks,
                    prefetch=prefetch,
                )
                for size in shard_sizes
            }
    finally:
        await store.close()


async def ledger_size_rows(cluster: EmbeddedCluster) -> list[dict[str, Any]]:
    """The ledger's size in etcd for a 10^9-sample dataset, 1,000 ranks holding 2 shards
    each, at two shard sizes."""
    rows = []
    with console.status("ledger size in etcd"):
        sizes = await bench_ledger_sizes(
            cluster, dataset_size=10**9, shard_sizes=(10**4, 10**5), ranks=1000, prefetch=2
        )
    for shard_size, size in sizes.items():
        console.print(
            f"ledger, {shard_size:,}-sample shards: {size['bytes']:,.0f} bytes, filled at "
            f"{size['fetches_per_s']:,.0f} fetches/s; encode {size['encode_ms']:.1f} ms, "
            f"decode {size['decode_ms']:.1f} ms"
        )
        rows.append(
            {
                "what": f"ledger bytes in etcd: 10^9 samples, {shard_size:,}-sample shards, "
                f"{size['in_flight']:,.0f} in flight (1,000 ranks x 2)",
                "value": size["bytes"],
                "baseline": None,
                "baseline_what": "",
                "target": "reported",
                "details": size,
            }
        )
    return rows
