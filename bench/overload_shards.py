"""The shards half of the overload bench (overload.py): a job's ranks fetch and report in
a closed loop (their replies/s: the sustainable rate), then, while they go on, a flood of
extra fetches at FACTOR times that rate for a bounded time, then the ranks finish the job.
Checked on every reply: no shard granted to two ranks; at the end, every shard done once."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from antdt.runtime.bus import Bus, BusError, RequestRefused
from antdt.runtime.servers import EmbeddedCluster
from antdt.schemas import (
    REPLY_HEADER,
    ErrorReply,
    FetchStatus,
    JobSpec,
    ShardFetch,
    ShardReply,
    ShardStatus,
    ShardStatusRequest,
    Subjects,
)
from bench.cases import _settings
from bench.overload_process import RawPublisher, paced, replica, settled

RANKS = 64


@dataclass
class Ledger:
    """What the ranks were told: who holds each shard, and which each one has done."""

    owner: dict[tuple[int, int], int] = field(default_factory=dict)
    done: Counter[tuple[int, int]] = field(default_factory=Counter)
    doubled: int = 0

    def granted(self, rank: int, reply: ShardReply) -> None:
        for grant in reply.grants:
            if self.owner.setdefault((grant.epoch, grant.shard), rank) != rank:
                self.doubled += 1


@dataclass
class Rank:
    rank: int
    held: tuple[Any, ...] = ()
    finished: bool = False
    replies: int = 0
    timeouts: int = 0


async def work(bus: Bus, subject: str, job: str, rank: Rank, ledger: Ledger) -> None:
    """One rank until the job is done: report what it holds as done, want one more."""
    confirmed: set[tuple[int, int]] = set()
    while not rank.finished:
        report = rank.held[:64]
        sent = ShardFetch(job=job, rank=rank.rank, epoch=0, done=report, want=0 if report else 1)
        try:
            reply = await bus.request(subject, sent, ShardReply, timeout=5)
        except RequestRefused:
            await asyncio.sleep(0.05)
            continue
        except BusError:  # dropped under the flood: ask again, as an agent does
            rank.timeouts += 1
            continue
        rank.replies += 1
        ledger.granted(rank.rank, reply)
        for ref in report:
            if (ref.epoch, ref.shard) not in confirmed:
                confirmed.add((ref.epoch, ref.shard))
                ledger.done[(ref.epoch, ref.shard)] += 1
        reported = {(r.epoch, r.shard) for r in report}
        rank.held = tuple(g.ref() for g in reply.grants if (g.epoch, g.shard) not in reported)
        rank.finished = reply.status is FetchStatus.JOB_DONE


class Flood:
    """Fetches of the job's ranks sent without waiting for their replies, which come to one
    inbox: each counted as granted, refused (by code) or unanswered."""

    def __init__(self, bus: Bus, subject: str, job: str, ledger: Ledger) -> None:
        self.bus, self.subject, self.ledger = bus, subject, ledger
        self.inbox = bus.nc.new_inbox()
        self.requests = [
            ShardFetch(job=job, rank=r, epoch=0, want=1).model_dump_json().encode()
            for r in range(RANKS)
        ]
        self.answered = 0
        self.refused: Counter[str] = Counter()

    async def __aenter__(self) -> Flood:
        self._sub = await self.bus.nc.subscribe(self.inbox + ".*", cb=self._on_reply)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._sub.unsubscribe()

    def frames(self) -> list[bytes]:
        """One fetch of each rank, its reply to the rank's own inbox."""
        return [
            RawPublisher.frame(self.subject, f"{self.inbox}.{rank}", data)
            for rank, data in enumerate(self.requests)
        ]

    async def _on_reply(self, msg: Any) -> None:
        self.answered += 1
        if (msg.headers or {}).get(REPLY_HEADER) == "ErrorReply":
            self.refused[ErrorReply.model_validate_json(msg.data).code] += 1
            return
        rank = int(msg.subject.rsplit(".", 1)[-1])
        self.ledger.granted(rank, ShardReply.model_validate_json(msg.data))


async def drive_shards(
    cluster: EmbeddedCluster, *, seconds: float, factor: int, shards: int = 20_000
) -> dict[str, Any]:
    base = _settings(cluster, f"ovs{time.monotonic_ns() % 10**9}")
    subjects, job = Subjects(base.nats.subject_prefix), "overload"
    spec = JobSpec(job=job, world_size=RANKS, dataset_size=shards, shard_size=1, global_batch=RANKS)
    subject, ledger = subjects.shards(job, "fetch"), Ledger()
    ranks = [Rank(r) for r in range(RANKS)]
    names = ("bench-overload-ranks", "bench-overload-flood")
    async with replica("shards", base, spec, buses=names) as run:
        service, (bus, flood_bus) = run.service, run.buses
        await _ready(bus, subjects, job)
        working = asyncio.gather(*(work(bus, subject, job, r, ledger) for r in ranks))
        try:
            await asyncio.sleep(1.0)  # warm
            before, started = sum(r.replies for r in ranks), time.perf_counter()
            await asyncio.sleep(2.0)
            rate = (sum(r.replies for r in ranks) - before) / (time.perf_counter() - started)
            if any(r.finished for r in ranks):
                raise RuntimeError(f"bench: {shards} shards ran out before the flood: give more")
            rss_base = (await service.status())["rss"]
            stop = asyncio.Event()
            sampling = asyncio.create_task(service.sample(stop))
            publisher = await RawPublisher.connect(base.nats.url)
            async with Flood(flood_bus, subject, job, ledger) as flood:
                sent, took = await paced(flood.frames(), publisher, factor * rate, seconds)
                await publisher.close()
                await settled(lambda: _answered(flood), idle_s=2.0)
            await asyncio.wait_for(working, timeout=300)
        finally:
            working.cancel()  # the ranks stop with the run, however it ends
            await asyncio.gather(working, return_exceptions=True)
        stop.set()
        await sampling
        final = await service.status()
    refused = final["metrics"].get("antdt.shards.requests.refused", {})
    every = {(0, s) for s in range(shards)}
    return {
        "sustainable_per_s": rate,
        "offered_per_s": sent / took,
        "factor": sent / took / rate,
        "seconds": took,
        "sent": sent,
        "answered": flood.answered,
        "refused_replies": dict(flood.refused),
        "dropped": refused.get("slow_consumer", 0),
        "refused": sum(n for code, n in refused.items() if code != "slow_consumer"),
        "rank_timeouts": sum(r.timeouts for r in ranks),
        "doubled": ledger.doubled + sum(1 for n in ledger.done.values() if n > 1),
        "lost": len(every - set(ledger.done)),
        "rss_base_mb": rss_base / 2**20,
        "rss_peak_mb": service.peak_rss / 2**20,
        "alive": run.lived,
    }


async def _answered(flood: Flood) -> int:
    return flood.answered


async def _ready(bus: Bus, subjects: Subjects, job: str) -> None:
    """Until the replica answers the job's status."""
    deadline = time.monotonic() + 30
    while True:
        try:
            await bus.request(
                subjects.shards(job, "status"), ShardStatusRequest(job=job), ShardStatus, timeout=2
            )
            return
        except BusError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
