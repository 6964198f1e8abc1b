"""Shards service shell: done-and-fetch over request/reply in a queue group, ledger in etcd.

Every replica serves every job. A request's ledger change is one compare-and-swap on the
ledger key, so two replicas can never grant the same shard twice: the loser reloads and
re-applies. Within one replica requests of a job are serialised and the ledger is cached
with its revision, so the steady state costs one etcd transaction per request."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import structlog
from pydantic import Field

from antdt.runtime.bus import Bus, Delivery, Rejected
from antdt.runtime.config import ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.store import Store
from antdt.schemas import (
    ErrorReply,
    JobSpec,
    Keys,
    ShardFetch,
    ShardReply,
    ShardStatus,
    ShardStatusRequest,
    Subjects,
)
from antdt.services.shards.ledger import LedgerState, apply_fetch, new_ledger, status

log = structlog.get_logger("antdt.shards")
QUEUE_GROUP = "antdt-shards"


class ShardsSettings(ServiceSettings):
    cas_retries: int = Field(default=20, ge=1, description="Ledger CAS attempts per request")


@dataclass
class _Cached:
    state: LedgerState
    revision: int


class ShardsService:
    def __init__(self, settings: ShardsSettings, bus: Bus, store: Store) -> None:
        self.settings = settings
        self.bus = bus
        self.store = store
        self.subjects = Subjects(settings.nats.subject_prefix)
        self.keys = Keys(settings.etcd.key_prefix)
        self._cache: dict[str, _Cached] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.cas_conflicts = 0

    async def start(self, runtime: ServiceRuntime) -> None:
        await self.bus.subscribe(
            self.subjects.any_job("shards.fetch"), ShardFetch, self._on_fetch, queue=QUEUE_GROUP
        )
        await self.bus.subscribe(
            self.subjects.any_job("shards.status"),
            ShardStatusRequest,
            self._on_status,
            queue=QUEUE_GROUP,
        )
        runtime.on_shutdown("drain", self.bus.drain)
        log.info("shards service started", replica=self.settings.replica_id)

    def _check_subject(self, job: str, delivery: Delivery) -> None:
        if self.subjects.job_of(delivery.subject) != job:
            raise Rejected("bad_request", f"job {job!r} does not match the subject")

    async def _on_fetch(self, req: ShardFetch, delivery: Delivery) -> ShardReply:
        self._check_subject(req.job, delivery)
        async with self._locks.setdefault(req.job, asyncio.Lock()):
            for _ in range(self.settings.cas_retries):
                cached = await self._load(req.job)
                state, reply = apply_fetch(cached.state, req)
                if isinstance(reply, ErrorReply):
                    raise Rejected(reply.code, reply.error)
                if state == cached.state:
                    return reply
                if await self._save(req.job, cached, state):
                    return reply
                self.cas_conflicts += 1
                self._cache.pop(req.job, None)
        raise Rejected("busy", "ledger contended; retry")

    async def _on_status(self, req: ShardStatusRequest, delivery: Delivery) -> ShardStatus:
        self._check_subject(req.job, delivery)
        self._cache.pop(req.job, None)  # status reads fresh state from etcd
        return status((await self._load(req.job)).state)

    async def _load(self, job: str) -> _Cached:
        if job in self._cache:
            return self._cache[job]
        stored = await self.store.get_model(self.keys.ledger(job), LedgerState)
        if stored is not None:
            cached = _Cached(stored[0], stored[1])
        else:
            spec = await self.store.get_model(self.keys.spec(job), JobSpec)
            if spec is None:
                raise Rejected("unknown_job", f"job {job!r} is not registered")
            cached = _Cached(new_ledger(spec[0]), 0)
        self._cache[job] = cached
        return cached

    async def _save(self, job: str, cached: _Cached, state: LedgerState) -> bool:
        key = self.keys.ledger(job)
        revision = await self.store.cas(key, state.model_dump_json().encode(), cached.revision)
        if revision is None:
            return False
        self._cache[job] = _Cached(state, revision)
        return True
