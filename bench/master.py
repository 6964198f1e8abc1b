"""Baseline for the shards bench: an in-memory shard master as DLRover builds its own (a
queue of shards to do, a dict of shards being done; nothing durable, nothing fenced),
answering ShardFetch over this project's transport in its own process. Driven as
DLRover's client drives its master (done report, then fetch: two requests a cycle) and
with AntDT's one request a cycle."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

from antdt.runtime import loops
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import NatsSettings
from antdt.runtime.store import Store
from antdt.schemas import FetchStatus, JobSpec, ShardFetch, ShardGrant, ShardReply, Subjects
from antdt.services.shards.state import ceil_div
from bench.replicas import Children
from bench.shards import bench_shards_cycles

#: The master's subject prefix: its own, so that no shards replica answers for it.
PREFIX = "bench.master"


class MemoryShards:
    """One job's shards, in memory: to do (in order), being done (shard -> rank)."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.todo: deque[int] = deque(range(ceil_div(spec.dataset_size, spec.shard_size)))
        self.doing: dict[int, int] = {}
        self.done = 0

    def fetch(self, req: ShardFetch) -> ShardReply:
        for ref in req.done:
            if self.doing.get(ref.shard) == req.rank:
                del self.doing[ref.shard]
                self.done += 1
        grants: list[ShardGrant] = []
        size, total = self.spec.shard_size, self.spec.dataset_size
        while len(grants) < req.want and self.todo:
            shard = self.todo.popleft()
            self.doing[shard] = req.rank
            start = shard * size
            grants.append(
                ShardGrant(
                    epoch=0, shard=shard, attempt=0, start=start, end=min(start + size, total)
                )
            )
        status = FetchStatus.OK if grants or self.todo else FetchStatus.EPOCH_DONE
        return ShardReply(job=self.spec.job, epoch=0, status=status, grants=tuple(grants))


def _master_process(url: str, conn: Any) -> None:
    from antdt.runtime.telemetry.logs import configure_logging

    configure_logging("warning", "console")
    loops.run(_serve(url, conn), "auto")


async def _serve(url: str, conn: Any) -> None:
    """Serve every job registered over `conn` until told "exit"; on "go" and "counters"
    report CPU seconds and requests served since "go", as a shards replica does."""
    bus = await Bus(NatsSettings(url=url, subject_prefix=PREFIX), name="memory-master").connect()
    subjects = Subjects(PREFIX)
    jobs: dict[str, MemoryShards] = {}
    served = 0

    async def on_fetch(req: ShardFetch, delivery: Delivery) -> ShardReply:
        nonlocal served
        served += 1
        return jobs[req.job].fetch(req)  # never awaits: one subscription serves in order

    await bus.subscribe(subjects.any_job("shards.fetch"), ShardFetch, on_fetch)
    conn.send("ready")
    at_go, served_at_go = 0.0, 0
    while (command := await asyncio.to_thread(conn.recv)) != "exit":
        if isinstance(command, JobSpec):
            jobs[command.job] = MemoryShards(command)
            conn.send("registered")
            continue
        if command == "go":
            at_go, served_at_go = time.process_time(), served
        conn.send({"cpu_s": time.process_time() - at_go, "requests": served - served_at_go})
    await bus.close()


class MemoryMaster:
    """The in-memory master in a child process, driven like ShardsReplicas."""

    count = 1

    def __init__(self, url: str, server_pids: dict[str, int | None]) -> None:
        self.nats = NatsSettings(url=url, subject_prefix=PREFIX)
        self.subjects = Subjects(PREFIX)
        self.server_pids = server_pids
        self._children = Children("the in-memory master", [(_master_process, (url,))])

    async def __aenter__(self) -> MemoryMaster:
        await self._children.started()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._children.stop()

    async def _ask(self, command: Any) -> Any:
        [answer] = await self._children.ask(command)
        return answer

    async def register(self, store: Store | None, spec: JobSpec) -> None:
        await self._ask(spec)  # the master keeps it in memory: no store

    async def go(self) -> None:
        await self._ask("go")

    async def counters(self) -> dict[str, float]:
        return dict(await self._ask("counters"))


async def bench_memory_master_cycles(
    master: MemoryMaster, clients: int, seconds: float, split: bool = False
) -> dict[str, float]:
    """One run of the shards bench's cycles against a running master; `split`: each
    cycle in two requests, done then fetch, as DLRover's client makes it."""
    return await bench_shards_cycles(master, None, clients=clients, seconds=seconds, split=split)
