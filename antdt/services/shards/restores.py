"""Restores of a restarted job, as the shell serves them: a request whose token the working
ledger carries is answered from it; the others, arriving together, share one read of the
snapshot (and of the job's spec). Should the token turn out new after all, the operation
refuses with ErrorCode.NOT_READ and the request is applied again with what it needs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from pydantic import BaseModel

from antdt.runtime.bus import Rejected
from antdt.runtime.store import StoreError
from antdt.schemas import ErrorCode, Keys, ShardRestore
from antdt.services.shards.change import Operation
from antdt.services.shards.ops import restore_op
from antdt.services.shards.state import LedgerState


class Stored(Protocol):
    """What a restore reads (stored.EtcdLedgers)."""

    async def fresh(self, job: str) -> LedgerState: ...
    async def snapshot(self, job: str, step: int) -> LedgerState | None: ...


class Ledgers(Protocol):
    """Where a restore is applied (committer.Committer)."""

    def working(self, job: str) -> LedgerState | None: ...
    async def submit(self, job: str, op: Operation) -> BaseModel: ...


class Restores:
    def __init__(self, stored: Stored, keys: Keys, ledgers: Ledgers) -> None:
        self.stored = stored
        self.keys = keys
        self.ledgers = ledgers
        self.reads = 0  # snapshot and spec reads from etcd, shared by concurrent requests
        self._reading: dict[tuple[str, ...], asyncio.Future[Any]] = {}

    async def submit(self, req: ShardRestore) -> BaseModel:
        working = self.ledgers.working(req.job)
        if working is not None and working.restore_token == req.token:
            # Answered from the ledger: neither the snapshot nor the start is read.
            try:
                return await self.ledgers.submit(req.job, restore_op(req, self.keys, None, None))
            except Rejected as refused:
                if refused.code != ErrorCode.NOT_READ:
                    raise
            # The token was new after all (the ledger was reloaded meanwhile): read them.
        snapshot, fresh = await self._inputs(req)
        return await self.ledgers.submit(req.job, restore_op(req, self.keys, snapshot, fresh))

    async def _inputs(self, req: ShardRestore) -> tuple[LedgerState | None, LedgerState]:
        """The snapshot of `req.step` (None: not kept) and the job's start. A read that
        etcd fails is refused as `unavailable`, which the rank retries: etcd away must
        not be final for a restarted job."""
        try:
            fresh = await self._fresh(req.job)
            if req.step is None:
                return None, fresh
            return await self._snapshot(req.job, req.step), fresh
        except StoreError as exc:  # etcd away or refusing: worth another try
            reason = f"ledger store unavailable: {type(exc).__name__}"
            raise Rejected(ErrorCode.UNAVAILABLE, reason) from exc

    async def _fresh(self, job: str) -> LedgerState:
        result: LedgerState = await self._once(("spec", job), lambda: self.stored.fresh(job))
        return result

    async def _snapshot(self, job: str, step: int) -> LedgerState | None:
        key = ("snapshot", job, str(step))
        result: LedgerState | None = await self._once(key, lambda: self.stored.snapshot(job, step))
        return result

    async def _once(self, key: tuple[str, ...], read: Callable[[], Awaitable[Any]]) -> Any:
        """`read()`, shared by the requests that ask while it runs (not cached after)."""
        reading = self._reading.get(key)
        if reading is None:
            self.reads += 1
            reading = asyncio.ensure_future(read())
            self._reading[key] = reading
            reading.add_done_callback(lambda _: self._reading.pop(key, None))
        # Shielded: one waiter giving up (a timeout) must not cancel the others' read.
        return await asyncio.shield(reading)
