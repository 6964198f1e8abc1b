"""Checkpoints of large jobs through a real shards replica: every rank of a job holding
`prefetch` shards commits the same checkpoint, as agents do after one synced step, then
restores it. Reported: the commit rate, the time to complete, the ledger's peak size
(against the same state as JSON objects) and the restore time."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from antdt.runtime.bus import Bus
from antdt.runtime.config import EtcdSettings
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store
from antdt.schemas import (
    CommitReply,
    JobSpec,
    RestoreReply,
    ShardCommit,
    ShardGrant,
    ShardPosition,
    ShardRestore,
)
from bench.ledger_size import grant_every_rank, stored_ledger
from bench.replicas import ShardsReplicas
from bench.shards import percentiles

#: Requests in flight at once: agents all commit at once, but one client process
#: holding 10^4 requests would measure itself more than the service.
CONCURRENT = 2048


async def bench_checkpoint(
    cluster: EmbeddedCluster, *, ranks: int, prefetch: int = 2
) -> dict[str, float]:
    store = await Store(EtcdSettings(endpoint=cluster.etcd.endpoint)).connect()
    try:
        async with ShardsReplicas(cluster, count=1) as replica:
            return await _checkpoint(replica, store, ranks, prefetch)
    finally:
        await store.close()


async def _checkpoint(
    replica: ShardsReplicas, store: Store, ranks: int, prefetch: int
) -> dict[str, float]:
    job = f"ckpt{ranks}"
    spec = JobSpec(
        job=job, world_size=ranks, dataset_size=10**9, shard_size=10**4, global_batch=ranks * 32
    )
    await replica.register(store, spec)
    bus = await Bus(replica.nats, name="bench-checkpoint").connect()
    gate = asyncio.Semaphore(CONCURRENT)
    latencies: list[float] = []
    completed: list[CommitReply] = []

    async def commit(rank: int, grants: tuple[ShardGrant, ...]) -> None:
        positions = tuple(
            ShardPosition(epoch=0, shard=g.shard, attempt=g.attempt, position=g.size // 2)
            for g in grants[:1]  # half-way through its first shard
        )
        request = ShardCommit(job=job, rank=rank, step=10, epoch=0, positions=positions)
        async with gate:
            sent = time.perf_counter()
            reply = await bus.request(
                replica.subjects.shards(job, "commit"), request, CommitReply, timeout=60
            )
            latencies.append(time.perf_counter() - sent)
        if reply.completed_now:
            completed.append(reply)

    try:
        held, fetches_per_s = await grant_every_rank(
            bus, replica, job, ranks, prefetch, concurrent=CONCURRENT
        )
        await replica.go()
        started = time.perf_counter()
        await asyncio.gather(*(commit(r, held[r]) for r in range(ranks - 1)))
        peak = await stored_ledger(store, replica, job)  # every rank but the last committed
        await commit(ranks - 1, held[ranks - 1])
        elapsed = time.perf_counter() - started
        counters = await replica.counters()
        restored_s = await _restore_all(bus, replica, job, ranks, gate)
    finally:
        await bus.close()
    if len(completed) != 1:
        raise RuntimeError(f"the checkpoint completed {len(completed)} times")
    return {
        "ranks": ranks,
        "fetches_per_s": fetches_per_s,
        "commits_per_s": ranks / elapsed,
        "complete_s": elapsed,
        **percentiles(latencies),
        "service_cpu_us_per_commit": counters["cpu_s"] / ranks * 1e6,
        "peak_bytes": len(peak),
        "peak_bytes_as_objects": len(_as_objects(peak)),
        "requests_per_write": counters["committed"] / max(counters["commits"], 1),
        "restore_s": restored_s,
        "restores_per_s": ranks / restored_s,
    }


async def _restore_all(
    bus: Bus, replica: ShardsReplicas, job: str, ranks: int, gate: asyncio.Semaphore
) -> float:
    """The job restarts from the checkpoint: every rank restores it with the same token,
    as agents of a restarted job do. Seconds until every rank has its answer."""
    subject = replica.subjects.shards(job, "restore")

    async def restore(rank: int) -> None:
        request = ShardRestore(job=job, rank=rank, token="bench-restart", step=10)
        async with gate:
            await bus.request(subject, request, RestoreReply, timeout=600)

    started = time.perf_counter()
    await asyncio.gather(*(restore(r) for r in range(ranks)))
    return time.perf_counter() - started


def _as_objects(value: bytes) -> bytes:
    """The same ledger as it was stored before columns: every list as JSON objects."""
    from antdt.services.shards.ledger import LedgerState

    state = LedgerState.model_validate_json(value)
    return json.dumps(state.model_dump(mode="python"), separators=(",", ":")).encode()


def checkpoint_rows(results: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for ranks, got in results.items():
        rows.append(
            {
                "what": f"checkpoint commits/s through one replica, {ranks:,} ranks x 2 shards",
                "value": got["commits_per_s"],
                "p50_ms": got["p50_ms"],
                "p99_ms": got["p99_ms"],
                "baseline": got["fetches_per_s"],
                "baseline_what": "fetches/s granting those shards",
                "target": "reported (no O(ranks) per commit)",
                "details": got,
            }
        )
    for ranks, got in results.items():
        rows.append(
            {
                "what": f"restores/s, every rank of a restarted {ranks:,}-rank job at once",
                "value": got["restores_per_s"],
                "baseline": got["fetches_per_s"],
                "baseline_what": "fetches/s granting its shards",
                "target": "reported (one snapshot read per restart)",
                "details": got,
            }
        )
    largest = results[max(results)]
    rows.append(
        {
            "what": f"ledger bytes at a checkpoint's peak, {largest['ranks']:,} ranks x 2 "
            "shards, all but one committed",
            "value": largest["peak_bytes"],
            "baseline": largest["peak_bytes_as_objects"],
            "baseline_what": "as JSON objects, the format before",
            "target": "< 1,572,864 (etcd's request limit)",
            "details": largest,
        }
    )
    return rows
