"""Monitor ingest: one replica's step-event rate against raw nats-py pub/sub, and the
same replica under a burst far past what it ingests in a lease's TTL. Events come from
the load generator process (publisher.py); a ticker on the monitor's loop measures how
long the loop went without a turn."""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from typing import Any

from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import NatsSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store
from antdt.schemas import (
    ErrorCode,
    Incident,
    IncidentKind,
    IncidentState,
    JobSpec,
    MonitorParams,
    RankHello,
    Subjects,
)
from bench.children import start_module
from bench.publisher import PUBLISHER_NATS, step_event
from bench.secured import Access

#: Ranks of the load generator's job.
RANKS = 64


async def bench_raw_pubsub(url: str, *, messages: int) -> dict[str, float]:
    """Baseline: a nats-py subscriber callback that only counts, fed by the same load
    generator process as the monitor case (same payloads, one subject)."""
    sub = await Bus(NatsSettings(url=url), name="raw-sub").connect()
    count = 0

    async def on_msg(msg: Any) -> None:
        nonlocal count
        count += 1

    await sub.nc.subscribe("raw.bench", cb=on_msg, pending_msgs_limit=messages * 2)
    await sub.flush()
    expected = messages // RANKS * RANKS  # whole steps of the ranks, as the monitor case
    load = await _load(
        {"url": url, "subject_prefix": "raw"}, "bench", messages, "--raw", "raw.bench"
    )
    _, elapsed = await _received(lambda: count, expected)
    await load.wait()
    await sub.close()
    return {"msgs_per_s": count / elapsed, "lost": expected - count}


async def bench_monitor_ingest(
    cluster: EmbeddedCluster,
    *,
    events: int,
    stalled_first: bool = False,
    access: Access | None = None,
) -> dict[str, float]:
    """Step events of 64 ranks from the load generator, ingested by one monitor replica that
    owns the job: the rate, events lost (`dropped`: behind a full queue), jobs lost with the
    lease, and the loop's longest hold (`longest_hold_s`). `stalled_first`: all ranks but
    one stalled when the events come, so the first events also resolve 63 incidents.
    `access`: other servers and each client's user there (default: `cluster`, plaintext)."""
    from antdt.services.monitor.service import MonitorService, MonitorSettings

    access = access or Access.plain(cluster, f"ingest{time.monotonic_ns() % 10**9}")
    settings = MonitorSettings(
        nats=access.nats("monitor"), etcd=access.etcd("monitor"), replica_id="bench-monitor"
    )
    agent = access.nats_fields("agent-ingest")
    runtime = ServiceRuntime("bench-monitor")
    bus = await Bus(settings.nats, name="bench-monitor").connect()
    store = await Store(settings.etcd).connect()
    spec = JobSpec(
        job="bench",
        world_size=RANKS,
        dataset_size=10**6,
        shard_size=1000,
        global_batch=32 * RANKS,
        monitor=MonitorParams(min_stall_s=1.0) if stalled_first else None,
    )
    await store.put(f"{settings.etcd.key_prefix}jobs/bench/spec", spec.model_dump_json().encode())
    monitor = MonitorService(settings, bus, store)
    jobs_lost: list[str] = []

    async def on_lost(job: str) -> None:
        jobs_lost.append(job)

    monitor.ownership.on_lost(on_lost)
    await monitor.start(runtime)
    await _take_on(NatsSettings(**agent), monitor)
    async with Stalls(access.nats("policy")) as stalls:
        if stalled_first:
            await stalls.wait_opened(RANKS - 1)
        warmup = monitor.ingested
        expected = events // RANKS * RANKS
        async with LoopHolds() as holds:
            load = await _load(agent, "bench", events)
            try:
                first, elapsed = await _received(lambda: monitor.ingested - warmup, expected)
            except RuntimeError as exc:  # say what the replica was doing
                raise RuntimeError(
                    f"{exc}; the replica owns {monitor.ownership.jobs}, watches "
                    f"{monitor.intake.watched}, dropped {monitor.dropped_not_owner} as "
                    f"not its own; the load generator exited {load.returncode}"
                ) from None
            ingested = monitor.ingested - warmup
            await load.wait()
    await runtime.shutdown()
    await store.close()
    came_back = [at - first for at in stalls.resolved.values()]
    counts = bus.rejections.counts
    dropped = sum(n for (_, code), n in counts.items() if code == ErrorCode.SLOW_CONSUMER)
    return {
        "events_per_s": ingested / elapsed,
        "lost": expected - ingested,
        "dropped": dropped,
        "jobs_lost": len(jobs_lost),
        "longest_hold_s": holds.longest_s,
        # The last stalled rank's resolution seen, from its first event ingested (inf:
        # not every one by the time the events were).
        "resolved_s": max(came_back, default=0.0)
        if len(came_back) == len(stalls.opened)
        else math.inf,
    }


async def _take_on(nats: NatsSettings, monitor: Any) -> None:
    """A rank's hello makes the replica claim the job (and subscribe to its steps), as
    when a job starts; until that is done steps reach nobody, so warm up (step 0) until
    one is ingested."""
    warm = await Bus(nats, name="bench-warmup").connect()
    subjects = Subjects(nats.subject_prefix)
    hello = RankHello(
        job="bench", rank=0, world_size=RANKS, host="h0", pid=1, started_at=time.time()
    )
    await warm.publish(subjects.hello("bench", 0), hello)
    first = (subjects.step("bench", 0), step_event(0, 0, "bench").model_dump_json())
    deadline = time.monotonic() + 30
    while monitor.ingested < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("monitor never claimed the bench job")
        await warm.publish_raw(first[0], first[1].encode())
        await asyncio.sleep(0.1)
    await warm.close()


class Stalls:
    """The job's stall incidents as a user sees them: ranks stalled, ranks come back."""

    def __init__(self, nats: NatsSettings) -> None:
        self.opened: set[int] = set()
        self.resolved: dict[int, float] = {}  # rank -> when its resolution came (perf_counter)
        self._nats = nats
        self._bus = Bus(nats, name="bench-stalls")

    async def __aenter__(self) -> Stalls:
        await self._bus.connect()
        subject = Subjects(self._nats.subject_prefix).incident("bench")
        await self._bus.subscribe(subject, Incident, self._on_incident)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._bus.close()

    async def _on_incident(self, incident: Incident, _: Delivery) -> None:
        if incident.kind is not IncidentKind.STALLED:
            return
        if incident.state is IncidentState.OPENED:
            self.opened.add(incident.rank)
        elif incident.state is IncidentState.RESOLVED and incident.rank in self.opened:
            self.resolved.setdefault(incident.rank, time.perf_counter())

    async def wait_opened(self, ranks: int) -> None:
        deadline = time.monotonic() + 30
        while len(self.opened) < ranks:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(self.opened)} of {ranks} ranks seen stalled")
            await asyncio.sleep(0.05)


class LoopHolds:
    """The longest time this loop went without a turn, as a 10 ms ticker sees it."""

    TICK_S = 0.01

    def __init__(self) -> None:
        self.longest_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopHolds:
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _tick(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(self.TICK_S)
            now = time.perf_counter()
            self.longest_s = max(self.longest_s, now - last - self.TICK_S)
            last = now


async def _load(nats: dict[str, Any], job: str, events: int, *extra: str) -> Any:
    """Start the load generator (bench.publisher) in its own process, connecting with
    the NatsSettings fields `nats` (in its environment: they may hold a password)."""
    env = {**os.environ, PUBLISHER_NATS: json.dumps(nats)}
    return await start_module("publisher", job, str(RANKS), str(events), *extra, env=env)


async def _received(
    count: Any, expected: int, *, idle_s: float = 2.0, first_within_s: float = 60.0
) -> tuple[float, float]:
    """When the first message was counted (perf_counter), and seconds from it to the
    last: the receiver's rate. None within `first_within_s`: an error, not a hang."""
    deadline = time.perf_counter() + first_within_s
    while count() == 0:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"bench: nothing received in {first_within_s:.0f} s")
        await asyncio.sleep(0.001)
    first = time.perf_counter()
    return first, await _until_settled(count, expected, first, idle_s=idle_s)


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
