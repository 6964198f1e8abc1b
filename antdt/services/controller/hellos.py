"""What each rank's latest process said of itself (RankHello): host, start, memory cap.
Every replica keeps the hellos it hears (a rank says hello before anyone owns its job);
the owner stores them at `jobs/{job}/ranks/{rank}`, fenced and written behind in
batches; loading a job merges the stored and the heard ones, the newest process winning."""

from __future__ import annotations

import asyncio
from itertools import islice

import structlog

from antdt.runtime.coordination.ownership import Ownership
from antdt.runtime.recent import Recent
from antdt.runtime.store import Put, Store, StoredValueInvalid, decode_stored
from antdt.schemas import Keys, RankHello

log = structlog.get_logger("antdt.controller.hellos")
#: Jobs whose hellos a replica keeps in memory (the least recently heard from go first).
MAX_JOBS = 4096
#: Hellos put in one transaction, at most (etcd refuses more than 128 operations in one).
WRITE_BATCH = 100


class RankHellos:
    def __init__(self, store: Store, keys: Keys, ownership: Ownership) -> None:
        self.store = store
        self.keys = keys
        self.ownership = ownership
        self._heard: Recent[dict[int, RankHello]] = Recent(MAX_JOBS)  # job -> rank -> latest
        self._unsaved: dict[str, dict[int, RankHello]] = {}  # job -> rank -> to store
        self._wake = asyncio.Event()
        self.writes = 0  # transactions that stored hellos

    def remember(self, hello: RankHello) -> bool:
        """Keep `hello` as its rank's latest; False if a newer process already said one."""
        ranks = self._heard.get(hello.job) or {}
        self._heard.put(hello.job, ranks)  # the job most recently heard from
        known = ranks.get(hello.rank)
        if known is not None and known.started_at > hello.started_at:
            return False
        ranks[hello.rank] = hello
        return True

    async def latest(self, job: str) -> list[RankHello]:
        """The latest hello of each rank of `job`, stored or heard (nothing is stored)."""
        newest = dict(await self._stored(job))
        for rank, hello in (self._heard.get(job) or {}).items():
            stored = newest.get(rank)
            if stored is None or hello.started_at > stored.started_at:
                newest[rank] = hello
        return [newest[rank] for rank in sorted(newest)]

    async def load(self, job: str) -> list[RankHello]:
        """The latest hello of each rank of `job`, stored or heard; the heard ones that
        are newer than the stored are stored (by the owner only, written behind)."""
        newest = dict(await self._stored(job))
        for rank, hello in (self._heard.get(job) or {}).items():
            stored = newest.get(rank)
            if stored is None or hello.started_at > stored.started_at:
                newest[rank] = hello
                self.save(hello)
        return [newest[rank] for rank in sorted(newest)]

    def save(self, hello: RankHello) -> None:
        """Store `hello` if we own its job, soon (write_loop); a lost race or etcd away
        is logged, and the next owner stores what it heard."""
        self._unsaved.setdefault(hello.job, {})[hello.rank] = hello
        self._wake.set()

    async def write_loop(self) -> None:
        """Run as a task: store the hellos saved since the last round, batched per job."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Store every hello saved and not yet stored (also the shutdown's last round)."""
        while self._unsaved:
            job = next(iter(self._unsaved))
            ranks = self._unsaved[job]
            batch = [ranks.pop(rank) for rank in list(islice(ranks, WRITE_BATCH))]
            if not ranks:
                del self._unsaved[job]
            await self._write(job, batch)

    async def _write(self, job: str, batch: list[RankHello]) -> None:
        puts = [Put(self.keys.rank_hello(job, h.rank), h.model_dump_json().encode()) for h in batch]
        try:
            result = await self.store.txn([self.ownership.fence(job)], puts)
        except Exception as exc:
            log.warning("hellos not stored", job=job, ranks=len(batch), error=str(exc))
            return
        if result.succeeded:
            self.writes += 1
        else:
            log.info("hellos not stored: job not ours", job=job, ranks=len(batch))

    async def _stored(self, job: str) -> dict[int, RankHello]:
        found: dict[int, RankHello] = {}
        for item in await self.store.get_prefix(self.keys.rank_hellos(job)):
            try:
                hello = decode_stored(item.key, item.value, RankHello)
            except StoredValueInvalid:
                log.warning("stored hello unreadable; ignored", key=item.key)
                continue
            if hello.job == job and item.key == self.keys.rank_hello(job, hello.rank):
                found[hello.rank] = hello
        return found
