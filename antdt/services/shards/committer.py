"""Group commit of ledger operations, per job.

Operations of a job that arrive while a commit is in flight queue up; the job's commit
task then applies every queued operation in arrival order to the cached ledger and
writes the result in ONE compare-and-swap transaction, so N concurrent requests cost one
etcd round trip and one fsync instead of N. Replies go out only after that transaction
succeeded: nothing is answered before it is durable.

Rejections wait for the transaction too. They are judged against the cached ledger
(plus the batch's earlier operations), and the cache may be stale when another replica
wrote: only a successful compare (CAS, or a compare-only check when the batch writes
nothing) proves the state they were judged on was the real one. On a conflict the batch
is re-applied, in the same order, to the state the failed transaction read back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from pydantic import BaseModel

from antdt.runtime.bus import Rejected
from antdt.schemas import ErrorReply
from antdt.services.shards.change import LedgerChange, Operation, Writes
from antdt.services.shards.ledger import LedgerState

log = structlog.get_logger("antdt.shards.committer")
#: Loop turns from a message read off the socket to its handler's enqueue (parse and
#: queue it; the subscription task runs the handler).
GATHER_TURNS = 2
Spawn = Callable[[str, Coroutine[Any, Any, None]], "asyncio.Task[None]"]


@dataclass(frozen=True)
class Snapshot:
    """A ledger as stored, with the store's compare-and-swap token for it."""

    state: LedgerState
    token: Any


@dataclass(frozen=True)
class Committed:
    """A commit's outcome: `ok` and the new snapshot, or a conflict and the snapshot the
    failed transaction read back; None: unknown, load it again."""

    ok: bool
    snapshot: Snapshot | None


class LedgerStore(Protocol):
    async def load(self, job: str) -> Snapshot:
        """The stored ledger, or a new one from the job's spec; Rejected if unknown."""

    async def commit(
        self, job: str, base: Snapshot, state: LedgerState | None, writes: Writes
    ) -> Committed:
        """Write `state` (None: keep the stored one) and `writes` only if the ledger is
        still at `base`; with nothing to write, only check that it is."""


@dataclass
class BatchResult:
    """What applying a batch to a state gives: the final state, the merged extra
    writes, one outcome per applied operation (a change, or the exception the operation
    raised), and how many operations of the batch were applied."""

    state: LedgerState
    writes: Writes
    outcomes: list[LedgerChange | Exception]

    @property
    def applied(self) -> int:
        return len(self.outcomes)


def apply_batch(state: LedgerState, ops: Sequence[Operation], *, max_writes: int) -> BatchResult:
    """Apply `ops` in order. A rejected (or failing) operation leaves the state as it
    was. Stops before an operation whose extra writes would exceed `max_writes` (etcd
    bounds the operations of one transaction), unless it is the first."""
    result = BatchResult(state, Writes(), [])
    for op in ops:
        try:
            change = op(result.state)
        except Exception as exc:  # a bug in one operation must not fail its neighbours
            log.exception("ledger operation failed")
            result.outcomes.append(exc)
            continue
        if not change.rejected:
            extra = len(change.puts) + len(change.deletes)
            if result.outcomes and len(result.writes) + extra > max_writes:
                break
            result.state = change.state
            result.writes.add(change)
        result.outcomes.append(change)
    return result


@dataclass
class _Pending:
    op: Operation
    future: asyncio.Future[BaseModel]


@dataclass
class _JobQueue:
    waiting: deque[_Pending] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    last_batch: int = 0  # size of the job's previous batch: how many requesters to expect
    expected: int = 0  # while lingering: wake when this many are waiting
    filled: asyncio.Event = field(default_factory=asyncio.Event)


class Committer:
    """Serialises each job's operations into batches, one transaction per batch."""

    def __init__(
        self,
        store: LedgerStore,
        spawn: Spawn,
        *,
        retries: int = 20,
        max_batch: int = 64,
        max_writes: int = 100,
        linger_s: float = 0.0,
    ) -> None:
        self.store = store
        self._spawn = spawn
        self.retries = retries
        self.max_batch = max_batch
        self.max_writes = max_writes
        self.linger_s = linger_s
        self.cache: dict[str, Snapshot] = {}
        self._jobs: dict[str, _JobQueue] = {}
        self._closed = False
        self.commits = 0  # successful transactions (writes or compare-only checks)
        self.committed = 0  # operations answered by them
        self.cas_conflicts = 0
        self.batch_sizes: Counter[int] = Counter()
        self.apply_seconds = 0.0  # in apply_batch (the pure ledger operations)
        self.store_seconds = 0.0  # waiting on the store's transactions

    @property
    def requests_per_commit(self) -> float:
        return self.committed / self.commits if self.commits else 0.0

    def enqueue(self, job: str, op: Operation) -> asyncio.Future[BaseModel]:
        """Queue `op` for `job`; the future resolves once its outcome is durable."""
        if self._closed:
            raise Rejected("unavailable", "shards replica shutting down; retry")
        future: asyncio.Future[BaseModel] = asyncio.get_running_loop().create_future()
        queue = self._jobs.setdefault(job, _JobQueue())
        queue.waiting.append(_Pending(op, future))
        if queue.expected and len(queue.waiting) >= queue.expected:
            queue.filled.set()
        if queue.task is None:
            queue.task = self._spawn(f"commit-{job}", self._run(job, queue))
        return future

    async def submit(self, job: str, op: Operation) -> BaseModel:
        """Apply `op` to `job`'s ledger; returns its reply once durable, raises Rejected
        for an ErrorReply (or `busy` / `unavailable` when it could not be committed)."""
        return await self.enqueue(job, op)

    async def finish(self) -> None:
        """Refuse new operations; let every queued and in-flight commit complete."""
        self._closed = True
        tasks = [q.task for q in self._jobs.values() if q.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, job: str, queue: _JobQueue) -> None:
        batch: list[_Pending] = []
        try:
            while queue.waiting:
                await self._gather(queue)
                batch = self._take(queue)
                queue.last_batch = len(batch)
                applied = await self._commit(job, batch) if batch else 0
                queue.waiting.extendleft(reversed(batch[applied:]))
                batch = []
        finally:
            queue.task = None  # no await between the empty check and here: none is lost
            if batch or queue.waiting:  # cancelled mid-commit: the outcome is unknown
                gone = Rejected("unavailable", "shards replica shutting down; retry")
                for pending in [*batch, *queue.waiting]:
                    _fail(pending, gone)
                queue.waiting.clear()
            self._forget_if_complete(job)

    def _forget_if_complete(self, job: str) -> None:
        """A finished job's ledger never changes again: keep neither it nor its queue (a
        late request reloads it), so a long-lived replica holds only live jobs."""
        cached = self.cache.get(job)
        if cached is not None and cached.state.complete:
            del self.cache[job]
            self._jobs.pop(job, None)

    async def _gather(self, queue: _JobQueue) -> None:
        """Let requests that are about to arrive join the next batch. Only while several
        ranks of the job are active (its previous batch had more than one): a lone
        requester's next request cannot come before its reply, so it never waits."""
        if queue.last_batch <= 1:
            return
        # Messages already read off the socket reach the queue a few loop turns later.
        for _ in range(GATHER_TURNS):
            await asyncio.sleep(0)
        # The ranks just answered are sending their next request: waiting for them, at
        # most linger_s, turns several transactions (fsyncs) into one.
        if self.linger_s > 0 and len(queue.waiting) < queue.last_batch:
            queue.expected = queue.last_batch
            queue.filled.clear()
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(queue.filled.wait(), self.linger_s)
            queue.expected = 0

    def _take(self, queue: _JobQueue) -> list[_Pending]:
        batch: list[_Pending] = []
        while queue.waiting and len(batch) < self.max_batch:
            pending = queue.waiting.popleft()
            if not pending.future.done():  # its requester gave up (cancelled)
                batch.append(pending)
        return batch

    async def _commit(self, job: str, batch: list[_Pending]) -> int:
        """Commit a prefix of `batch` and answer it; returns the prefix's length."""
        try:
            for _ in range(self.retries):
                base = self.cache.get(job) or await self.store.load(job)
                started = time.perf_counter()
                result = apply_batch(base.state, [p.op for p in batch], max_writes=self.max_writes)
                changed = result.state is not base.state and result.state != base.state
                applied = time.perf_counter()
                done = await self.store.commit(
                    job, base, result.state if changed else None, result.writes
                )
                self.apply_seconds += applied - started
                self.store_seconds += time.perf_counter() - applied
                self._recache(job, done.snapshot)
                if done.ok:
                    self._answer(batch, result)
                    return result.applied
                self.cas_conflicts += 1
            error = Rejected("busy", f"ledger of {job!r} contended; retry")
        except Rejected as exc:  # e.g. unknown_job from load
            error = exc
        except Exception as exc:  # etcd unreachable or refusing: the outcome is unknown
            self.cache.pop(job, None)
            log.warning("ledger commit failed", job=job, error=repr(exc))
            error = Rejected("unavailable", f"ledger store unavailable: {type(exc).__name__}")
        for pending in batch:
            _fail(pending, error)
        return len(batch)

    def _recache(self, job: str, snapshot: Snapshot | None) -> None:
        if snapshot is None:
            self.cache.pop(job, None)
        else:
            self.cache[job] = snapshot

    def _answer(self, batch: list[_Pending], result: BatchResult) -> None:
        self.commits += 1
        self.committed += result.applied
        self.batch_sizes[result.applied] += 1
        for pending, outcome in zip(batch, result.outcomes, strict=False):
            if isinstance(outcome, Exception):
                _fail(pending, outcome)
            elif isinstance(outcome.reply, ErrorReply):
                _fail(pending, Rejected(outcome.reply.code, outcome.reply.error))
            elif not pending.future.done():
                pending.future.set_result(outcome.reply)


def _fail(pending: _Pending, error: Exception) -> None:
    if not pending.future.done():
        pending.future.set_exception(error)
