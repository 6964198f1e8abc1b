"""Bytes a large job's ledger writes put into etcd's history, with the job's write budget
(`ledger_write_bytes_per_s`) and unpaced, under the same load: a thousand ranks asking
every few seconds change the ledger hundreds of times a second, and every write is the
whole ledger."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

from antdt.runtime.bus import Bus
from antdt.runtime.config import EtcdSettings
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store
from antdt.schemas import JobSpec, ShardFetch, ShardReply
from bench.replicas import ShardsReplicas
from bench.shards import percentiles

LEAD_S = 5.0  # at most this long before the measured window, waiting for the budget


async def bench_ledger_writes(
    cluster: EmbeddedCluster,
    *,
    ranks: int,
    every_s: float,
    seconds: float,
    budget: float | None,
    burst_s: float | None = None,
) -> dict[str, float]:
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
            spec = JobSpec(
                job=job,
                world_size=ranks,
                dataset_size=10**9,
                shard_size=10**4,
                global_batch=ranks * 32,
            )
            await replica.register(store, spec)
            bus = await Bus(replica.nats, name="bench-ledger-writes").connect()
            try:
                paced = budget is None or budget > 0
                return await _load(replica, bus, job, ranks, every_s, seconds, paced)
            finally:
                await bus.close()
    finally:
        await store.close()


async def _load(
    replica: ShardsReplicas,
    bus: Bus,
    job: str,
    ranks: int,
    every_s: float,
    seconds: float,
    paced: bool,
) -> dict[str, float]:
    """The load, measured over `seconds`; when `paced`, from the moment the budget first holds
    a write back (or after LEAD_S): the budget's bucket starts full, and a window that
    started full would count its burst as rate."""
    subject = replica.subjects.shards(job, "fetch")
    held: dict[int, tuple[Any, ...]] = dict.fromkeys(range(ranks), ())
    latencies: list[float] = []

    async def one_rank(rank: int, first_round: bool) -> None:
        """Ask at a random offset, then every `every_s` (once only in the first round)."""
        await asyncio.sleep(random.uniform(0, every_s))
        while True:
            request = ShardFetch(job=job, rank=rank, epoch=0, done=held[rank], want=1, held=())
            sent = time.perf_counter()
            reply = await bus.request(subject, request, ShardReply, timeout=30)
            latencies.append(time.perf_counter() - sent)
            # Done refs still unconfirmed are reported again, as the agent does.
            held[rank] = reply.unconfirmed + tuple(g.ref() for g in reply.grants)
            if first_round:
                return
            await asyncio.sleep(every_s)

    # A first round gives every rank a shard: the ledger at its working size.
    await asyncio.gather(*(one_rank(r, True) for r in range(ranks)))
    load = asyncio.gather(*(one_rank(r, False) for r in range(ranks)))
    try:
        lead_until = time.perf_counter() + (LEAD_S if paced else 0.0)
        while time.perf_counter() < lead_until and not (await replica.counters())["budget_waits"]:
            await asyncio.sleep(0.05)
        await replica.go()
        latencies.clear()
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        counters = await replica.counters()
        elapsed, answered = time.perf_counter() - started, list(latencies)
    finally:
        load.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await load
    return {
        "written_bytes_per_s": counters["written_bytes"] / elapsed,
        "commits_per_s": counters["commits"] / elapsed,
        "requests_per_s": len(answered) / elapsed,
        "requests_per_commit": counters["committed"] / max(counters["commits"], 1),
        "budget_waits": counters["budget_waits"],
        **percentiles(answered),
        "service_cpu_share": counters["cpu_s"] / elapsed,
    }
