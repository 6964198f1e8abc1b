"""Benchmark cases. Each returns plain figures; __main__ pairs them with baselines."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from antdt.runtime.bus import Bus
from antdt.runtime.config import EtcdSettings, NatsSettings, ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Put, Store
from antdt.schemas import (
    FetchStatus,
    JobSpec,
    RegisterReply,
    ShardFetch,
    ShardReply,
    StepEvent,
    Subjects,
)


def _settings(cluster: EmbeddedCluster, tag: str) -> ServiceSettings:
    return ServiceSettings(
        nats=NatsSettings(url=cluster.nats.url, subject_prefix=f"bench.{tag}"),
        etcd=EtcdSettings(endpoint=cluster.etcd.endpoint, key_prefix=f"/bench/{tag}/"),
        replica_id=f"bench-{tag}",
    )


async def bench_raw_pubsub(url: str, *, messages: int) -> dict[str, float]:
    """Baseline: nats-py publish → subscriber callback, same payload size as a StepEvent."""
    payload = _step(0, 0).model_dump_json().encode()
    pub = await Bus(NatsSettings(url=url), name="raw-pub").connect()
    sub = await Bus(NatsSettings(url=url), name="raw-sub").connect()
    count = 0

    async def on_msg(msg: Any) -> None:
        nonlocal count
        count += 1

    await sub.nc.subscribe("raw.bench", cb=on_msg, pending_msgs_limit=messages * 2)
    await sub.flush()
    started = time.perf_counter()
    for _ in range(messages):
        await pub.nc.publish("raw.bench", payload)
    elapsed = await _until_settled(lambda: count, messages, started)
    await pub.close()
    await sub.close()
    return {"msgs_per_s": count / elapsed, "lost": messages - count}


async def _until_settled(
    count: Any, expected: int, started: float, *, idle_s: float = 2.0
) -> float:
    """Seconds from `started` until `count()` reached `expected`, or until it stopped
    moving for `idle_s` (a slow consumer lost messages): then up to its last change."""
    last, last_change = -1, time.perf_counter()
    while count() < expected:
        now = time.perf_counter()
        if count() != last:
            last, last_change = count(), now
        elif now - last_change > idle_s:
            return last_change - started
        await asyncio.sleep(0.005)
    return time.perf_counter() - started


def _step(rank: int, n: int, job: str = "bench") -> StepEvent:
    return StepEvent(
        job=job, rank=rank, host=f"h{rank}", step=n, epoch=0, plan_version=0, local_batch=32,
        samples=32, compute_s=0.1, data_wait_s=0.001, comm_s=0.01, step_s=0.111,
        started_at=1e9 + n, ended_at=1e9 + n + 0.111,
    )  # fmt: skip


async def bench_monitor_ingest(cluster: EmbeddedCluster, *, events: int) -> dict[str, float]:
    """Step events published as fast as one client can, ingested by one monitor replica
    (validation + detector) that owns the job. The publisher works exactly as the raw
    baseline's does (pre-serialised payloads, nc.publish, same process and thread), so
    the printed ratio compares like with like."""
    from antdt.services.monitor.service import MonitorService, MonitorSettings

    base = _settings(cluster, "ingest")
    settings = MonitorSettings(**base.model_dump())
    runtime = ServiceRuntime("bench-monitor")
    bus = await Bus(settings.nats, name="bench-monitor").connect()
    store = await Store(settings.etcd).connect()
    keys_spec = JobSpec(job="bench", world_size=64, dataset_size=10**6, shard_size=1000,
                        global_batch=2048)  # fmt: skip
    await store.put(
        f"{settings.etcd.key_prefix}jobs/bench/spec", keys_spec.model_dump_json().encode()
    )
    monitor = MonitorService(settings, bus, store)
    await monitor.start(runtime)
    subjects = Subjects(settings.nats.subject_prefix)
    pub = await Bus(settings.nats, name="bench-pub").connect()
    payloads = [
        (subjects.step("bench", r), _step(r, n).model_dump_json().encode())
        for n in range(events // 64)
        for r in range(64)
    ]
    # First sight of the job makes the replica claim it; until that succeeds (the claim
    # loop retries) events are dropped, so warm up until one is ingested.
    deadline = time.monotonic() + 30
    while monitor.ingested < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("monitor never claimed the bench job")
        await pub.publish_raw(payloads[0][0], payloads[0][1])
        await asyncio.sleep(0.1)
    started = time.perf_counter()
    for subject, data in payloads[1:]:
        await pub.nc.publish(subject, data)
    warmup = monitor.ingested
    elapsed = await _until_settled(lambda: monitor.ingested - warmup + 1, len(payloads), started)
    ingested = monitor.ingested - warmup
    await pub.close()
    await runtime.shutdown()
    await store.close()
    return {"events_per_s": ingested / elapsed, "lost": len(payloads) - 1 - ingested}


async def bench_raw_etcd_txn(endpoint: str, *, seconds: float) -> dict[str, float]:
    """Baseline: serial single-key etcd transactions from one client."""
    store = await Store(EtcdSettings(endpoint=endpoint)).connect()
    deadline = time.perf_counter() + seconds
    started, count = time.perf_counter(), 0
    while time.perf_counter() < deadline:
        await store.txn([], [Put("/bench/raw", b"x" * 200)])
        count += 1
    await store.close()
    return {"txn_per_s": count / (time.perf_counter() - started)}


async def bench_shards_cycles(
    cluster: EmbeddedCluster, *, clients: int, seconds: float
) -> dict[str, float]:
    """Each client loops: report the shard it holds as done and fetch the next, in one
    request; one shards replica; every ledger change durable in etcd before the reply."""
    from antdt.services.controller.service import ControllerService, ControllerSettings
    from antdt.services.shards.service import ShardsService, ShardsSettings

    tag = f"shards{clients}"
    base = _settings(cluster, tag)
    runtime = ServiceRuntime("bench-shards")
    services = []
    for cls, service_cls in (
        (ShardsSettings, ShardsService),
        (ControllerSettings, ControllerService),
    ):
        settings = cls(**base.model_dump())
        bus = await Bus(settings.nats, name=f"bench-{cls.__name__}").connect()
        store = await Store(settings.etcd).connect()
        service = service_cls(settings, bus, store)  # type: ignore[arg-type]
        await service.start(runtime)
        services.append((bus, store))
    subjects = Subjects(base.nats.subject_prefix)
    client = await Bus(base.nats, name="bench-client").connect()
    spec = JobSpec(job="bench", world_size=clients, dataset_size=10**8, shard_size=10**4,
                   global_batch=clients * 32, epochs=1)  # fmt: skip
    await client.request(subjects.register("bench"), spec, RegisterReply)
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def one_client(rank: int) -> None:
        held: tuple = ()
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            reply = await client.request(
                subjects.shards("bench", "fetch"),
                ShardFetch(job="bench", rank=rank, epoch=0, done=held, want=1),
                ShardReply,
            )
            latencies.append(time.perf_counter() - started)
            if reply.status != FetchStatus.OK:
                break
            held = tuple(g.ref() for g in reply.grants)

    started = time.perf_counter()
    await asyncio.gather(*(one_client(r) for r in range(clients)))
    elapsed = time.perf_counter() - started
    await client.close()
    await runtime.shutdown()
    for _, store in services:
        await store.close()
    latencies.sort()
    return {
        "cycles_per_s": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(0.99 * (len(latencies) - 1))] * 1000,
    }


def bench_detector_memory(*, ranks: int, windows: int) -> dict[str, float]:
    """Bytes per tracked rank of one JobDetector after `windows` windows of every rank:
    tracemalloc around decoding + ingesting a healthy trace (the trace's bytes are
    allocated before tracing starts, so only what the detector keeps is counted)."""
    import tracemalloc

    from antdt.services.monitor.detector import DetectorConfig, JobDetector
    from antdt.sim.traces import generate, healthy

    window = DetectorConfig().window
    trace = generate(healthy(ranks, windows * window + window // 2, seed=7))
    payloads = [(now, event.model_dump_json().encode()) for now, event in trace.events]
    del trace
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    detector = JobDetector("trace", ranks)
    for now, data in payloads:
        detector.ingest(StepEvent.model_validate_json(data), now)
    detector.health(payloads[-1][0])
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {"bytes_per_rank": (after - before) / ranks, "ranks": ranks, "windows": windows}
