"""How fast a large job's ledger grows etcd: bytes its writes put into etcd's history.

Every ledger write is the whole ledger (about 50 bytes per shard in flight), and etcd
keeps each one until it compacts its history. A job of a thousand ranks, each asking
every few seconds, changes its ledger hundreds of times a second; unpaced, the shards
service writes it as often as etcd allows. The job's write budget
(`ledger_write_bytes_per_s`) paces the writes instead, each carrying the requests that
came meanwhile. This bench runs the same load with and without the budget."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from antdt.bench.shards import ShardsReplicas, percentiles
from antdt.runtime.bus import Bus
from antdt.runtime.config import EtcdSettings
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store
from antdt.schemas import JobSpec, ShardFetch, ShardReply


async def bench_ledger_writes(
    cluster: EmbeddedCluster, *, ranks: int, every_s: float, seconds: float,
    budget: float | None, burst_s: float | None = None,
) -> dict[str, float]:  # fmt: skip
    """`ranks` ranks of one job, each reporting its shard done and fetching the next
    every `every_s` seconds (started at random offsets); over `seconds` after a first
    round, the bytes per second the replica's ledger transactions wrote, their rate, and
    the fetch latency. `budget`, `burst_s`: the replica's write budget and burst (None:
    its defaults)."""
    settings: dict[str, Any] = {}
    if budget is not None:
        settings["ledger_write_bytes_per_s"] = budget
    if burst_s is not None:
        settings["ledger_write_burst_s"] = burst_s
    store = await Store(EtcdSettings(endpoint=cluster.etcd.endpoint)).connect()
    job = f"writes{ranks}-{'default' if budget is None else int(budget)}"
    try:
        async with ShardsReplicas(cluster, count=1, settings=settings) as replica:
            spec = JobSpec(job=job, world_size=ranks, dataset_size=10**9, shard_size=10**4,
                           global_batch=ranks * 32)  # fmt: skip
            await replica.register(store, spec)
            bus = await Bus(replica.nats, name="bench-ledger-writes").connect()
            try:
                return await _load(replica, bus, job, ranks, every_s, seconds)
            finally:
                await bus.close()
    finally:
        await store.close()


async def _load(
    replica: ShardsReplicas, bus: Bus, job: str, ranks: int, every_s: float, seconds: float
) -> dict[str, float]:
    subject = replica.subjects.shards(job, "fetch")
    held: dict[int, tuple[Any, ...]] = dict.fromkeys(range(ranks), ())
    latencies: list[float] = []

    async def one_rank(rank: int, until: float) -> None:
        """Ask at a random offset, then every `every_s` until `until` (at least once)."""
        await asyncio.sleep(random.uniform(0, every_s))
        while True:
            request = ShardFetch(job=job, rank=rank, epoch=0, done=held[rank], want=1, held=())
            sent = time.perf_counter()
            reply = await bus.request(subject, request, ShardReply, timeout=30)
            latencies.append(time.perf_counter() - sent)
            # Done refs still unconfirmed are reported again, as the agent does.
            held[rank] = reply.unconfirmed + tuple(g.ref() for g in reply.grants)
            if time.perf_counter() >= until:
                return
            await asyncio.sleep(every_s)

    # A first round gives every rank a shard: the ledger at its working size.
    await asyncio.gather(*(one_rank(r, time.perf_counter()) for r in range(ranks)))
    await replica.go()
    latencies.clear()
    started = time.perf_counter()
    await asyncio.gather(*(one_rank(r, started + seconds) for r in range(ranks)))
    elapsed = time.perf_counter() - started
    counters = await replica.counters()
    return {
        "written_bytes_per_s": counters["written_bytes"] / elapsed,
        "commits_per_s": counters["commits"] / elapsed,
        "requests_per_s": len(latencies) / elapsed,
        "requests_per_commit": counters["committed"] / max(counters["commits"], 1),
        "budget_waits": counters["budget_waits"],
        **percentiles(latencies),
        "service_cpu_share": counters["cpu_s"] / elapsed,
    }
