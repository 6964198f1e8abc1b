"""Overload: ten times the sustainable rate into one monitor replica (step events) and one
shards replica (fetch requests), each in a process of its own, for a bounded time. The
sustainable rate is measured first, in the same run (the baseline). Reported: the service
process's peak RSS against its RSS at the sustainable rate, what it dropped or refused as
its own metrics count them, whether it lived, and for the shards that every shard was
granted to one rank and done exactly once (overload_shards.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from itertools import islice
from typing import Any

from antdt.runtime.bus import Bus
from antdt.runtime.servers import EmbeddedCluster
from antdt.schemas import JobSpec, RankHello, Subjects
from bench.cases import _settings
from bench.overload_process import RawPublisher, ServiceProcess, paced, replica, settled
from bench.overload_shards import drive_shards
from bench.publisher import _template

FACTOR = 10
#: The monitor replica's CPU budget (a cgroup quota, as a deployment's resources cap a
#: service): uncapped on 2 cores it ingests ~59,000 events/s, and ten times that is more
#: than a publisher beside it can push through nats-server. Its rate is measured in the
#: same budget, so the factor is the replica's own.
MONITOR_CPUS = 0.25
#: What a shards replica may grow by under the flood: its request backlog is 20,000
#: requests per subject (ShardsSettings.request_backlog), a few KB each in memory.
SHARDS_GROWTH_MB = 256
RANKS = 64
INGESTED = "antdt.monitor.events.ingested"
#: Step events framed ahead of the overload (64 ranks x 1,000 steps, ~25 MB).
FRAMES = 64_000


def step_events(prefix: str, job: str, first_step: int) -> Iterator[tuple[str, bytes]]:
    """Every rank's step events, step after step, from `first_step` on, without end."""
    subjects = Subjects(prefix)
    templates = [(subjects.step(job, r), _template(r, job)) for r in range(RANKS)]
    n = first_step
    while True:
        for subject, template in templates:
            yield subject, (template % (n, 1e9 + n, 1e9 + n + 0.111)).encode()
        n += 1


# -- the monitor -------------------------------------------------------------------------


async def bench_monitor_overload(
    cluster: EmbeddedCluster, *, seconds: float, backlog_mb: int, base_events: int = 50_000
) -> dict[str, Any]:
    """A monitor replica owning a 64-rank job: `base_events` step events as fast as one
    client sends them (the sustainable rate: what it ingests a second), then FACTOR times
    that rate for `seconds`, with a step backlog of `backlog_mb` MiB."""
    base = _settings(cluster, f"ovm{time.monotonic_ns() % 10**9}")
    subjects, job = Subjects(base.nats.subject_prefix), "overload"
    spec = JobSpec(
        job=job, world_size=RANKS, dataset_size=10**6, shard_size=1000, global_batch=RANKS
    )
    config = {**base.model_dump(), "step_backlog_bytes": backlog_mb * 2**20}
    events = step_events(base.nats.subject_prefix, job, 1)
    async with replica(
        "monitor", base, spec, config=config, buses=("bench-overload",), cpus=MONITOR_CPUS
    ) as run:
        service, (bus,) = run.service, run.buses
        await _take_on(bus, subjects, job, service, next(events))
        publisher = await RawPublisher.connect(base.nats.url)
        before, started = await service.metric(INGESTED), time.perf_counter()
        await publisher.send(
            b"".join(RawPublisher.frame(s, "", d) for s, d in islice(events, base_events))
        )
        total = await settled(lambda: service.metric(INGESTED), idle_s=0.5)
        rate = (total - before) / (time.perf_counter() - started - 0.5)
        rss_base = (await service.status())["rss"]
        stop = asyncio.Event()
        sampling = asyncio.create_task(service.sample(stop))

        # Steps go on from there, and round again (the detector ignores a step it has seen).
        frames = [RawPublisher.frame(s, "", d) for s, d in islice(events, FRAMES)]
        sent, took = await paced(frames, publisher, FACTOR * rate, seconds)
        await publisher.close()
        after = await settled(lambda: service.metric(INGESTED))
        stop.set()
        await sampling
        final = await service.status()
    dropped = final["metrics"].get("antdt.monitor.events.rejected", {}).get("slow_consumer", 0)
    return {
        "sustainable_per_s": rate,
        "offered_per_s": sent / took,
        "factor": sent / took / rate,
        "seconds": took,
        "sent": sent,
        "ingested": after - total,
        "dropped": dropped,
        "unaccounted": sent - (after - total) - dropped,
        "rss_base_mb": rss_base / 2**20,
        "rss_peak_mb": service.peak_rss / 2**20,
        "backlog_mb": backlog_mb,
        "monitor_cpus": MONITOR_CPUS,
        "alive": run.lived,
    }


async def _take_on(
    bus: Bus, subjects: Subjects, job: str, service: ServiceProcess, first: tuple[str, bytes]
) -> None:
    """A rank's hello makes the replica claim the job and take its steps: until one is
    ingested, say hello and send the first step again."""
    hello = RankHello(job=job, rank=0, world_size=RANKS, host="h0", pid=1, started_at=1.0)
    deadline = time.monotonic() + 30
    while await service.metric(INGESTED) < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("bench: the monitor never took the job on")
        await bus.publish(subjects.hello(job, 0), hello)
        await bus.nc.publish(*first)
        await asyncio.sleep(0.2)


# -- the rows ------------------------------------------------------------------------------


async def overload_rows(cluster: EmbeddedCluster, *, seconds: float = 10.0) -> list[dict[str, Any]]:
    """The two rows; a row whose checks fail carries `failed` (make bench then fails)."""
    from bench.display import console

    with console.status(f"monitor at {FACTOR}x its step-event rate for {seconds:.0f} s"):
        monitor = await bench_monitor_overload(cluster, seconds=seconds, backlog_mb=64)
    with console.status(f"shards at {FACTOR}x its fetch rate for {seconds:.0f} s"):
        shards = await drive_shards(cluster, seconds=seconds, factor=FACTOR)
    rows = [
        {
            "what": f"monitor ({MONITOR_CPUS} CPU) at {monitor['factor']:.1f}x its sustainable "
            f"step-event rate for {monitor['seconds']:.0f} s: peak RSS, MB "
            f"({monitor['dropped']:,.0f} dropped and "
            f"counted, {monitor['unaccounted']:,.0f} unaccounted)",
            "value": monitor["rss_peak_mb"],
            "baseline": monitor["rss_base_mb"],
            "baseline_what": "RSS after the sustainable-rate run, MB",
            "target": f"peak <= baseline + 3 x the {monitor['backlog_mb']} MiB step backlog; "
            "every event ingested or counted as dropped; alive",
            "details": monitor,
        },
        {
            "what": f"shards at {shards['factor']:.1f}x its sustainable fetch rate for "
            f"{shards['seconds']:.0f} s: peak RSS, MB ({shards['dropped']:,.0f} dropped and "
            f"{shards['refused']:,.0f} refused, counted; "
            f"{shards['doubled']} shards doubled, {shards['lost']} lost)",
            "value": shards["rss_peak_mb"],
            "baseline": shards["rss_base_mb"],
            "baseline_what": "RSS after the sustainable-rate run, MB",
            "target": f"peak <= baseline + {SHARDS_GROWTH_MB} MB; every shard done exactly "
            "once; alive",
            "details": shards,
        },
    ]
    for row, problem in zip(rows, (monitor_problem(monitor), shards_problem(shards)), strict=True):
        console.print(f"{row['what']}: {row['value']:.0f} against {row['baseline']:.0f}")
        if problem:
            row["failed"] = f"overload: {problem}"
    return rows


def monitor_problem(got: dict[str, Any]) -> str | None:
    """Why the monitor's overload run missed its target (None: it did not)."""
    bound = got["rss_base_mb"] + 3 * got["backlog_mb"]
    if not got["alive"]:
        return "the monitor died"
    if got["unaccounted"]:
        return f"{got['unaccounted']:,.0f} step events neither ingested nor counted as dropped"
    if got["rss_peak_mb"] > bound:
        return f"the monitor's RSS peaked at {got['rss_peak_mb']:.0f} MB, over {bound:.0f}"
    return None


def shards_problem(got: dict[str, Any]) -> str | None:
    """Why the shards' overload run missed its target (None: it did not)."""
    bound = got["rss_base_mb"] + SHARDS_GROWTH_MB
    if not got["alive"]:
        return "the shards replica died"
    if got["doubled"] or got["lost"]:
        return f"{got['doubled']} shards doubled, {got['lost']} lost"
    if got["rss_peak_mb"] > bound:
        return f"the shards replica's RSS peaked at {got['rss_peak_mb']:.0f} MB, over {bound:.0f}"
    return None
