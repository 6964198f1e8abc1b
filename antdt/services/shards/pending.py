"""What a replica holds of one job's ledger between writes: the stored snapshot, the
working ledger, and the operations applied to it or waiting for it, with their answers."""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass, field

from pydantic import BaseModel

from antdt.runtime.bus import Rejected
from antdt.schemas import ErrorReply
from antdt.services.shards.budget import WriteBudget
from antdt.services.shards.change import LedgerChange, Operation
from antdt.services.shards.early import Stored
from antdt.services.shards.ledger import LedgerState
from antdt.services.shards.stored import Snapshot


@dataclass
class Applied:
    """An operation applied to the working ledger and not yet written."""

    op: Operation
    change: LedgerChange
    future: asyncio.Future[BaseModel]  # done once answered (early, or after the write)
    interval: float  # seconds its write may wait, once answered (Committer._interval)


@dataclass
class PendingJob:
    """One job's ledger in a replica: as stored, as worked on, and what lies between."""

    stored: Snapshot | None = None
    index: Stored | None = None
    working: LedgerState | None = None
    applied: list[Applied] = field(default_factory=list)
    waiting: deque[tuple[Operation, asyncio.Future[BaseModel]]] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    urgent: bool = False  # an answer waits on the next write
    due: float = math.inf  # monotonic time the next write is due by, answers aside
    used: float = 0.0  # monotonic time of the last operation enqueued
    budget: WriteBudget | None = None  # None: no write budget
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def rebase(self, snapshot: Snapshot) -> None:
        self.stored, self.index, self.working = snapshot, Stored(snapshot.state), snapshot.state


def idle(j: PendingJob, now: float, idle_s: float) -> bool:
    return j.task is None and not j.applied and not j.waiting and j.used + idle_s <= now


def answer(entry: Applied) -> None:
    if entry.future.done():
        return
    reply = entry.change.reply
    if isinstance(reply, ErrorReply):  # the change is rejected
        entry.future.set_exception(Rejected(reply.code, reply.error))
    else:
        entry.future.set_result(reply)


def fail(future: asyncio.Future[BaseModel], error: Exception) -> None:
    if not future.done():
        future.set_exception(error)
