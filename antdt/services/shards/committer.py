"""Write-behind group commit of ledger operations, per job: each operation is applied to
the job's working ledger as it arrives and answered early (early.py) or once the write
carrying it is durable; one compare-and-swap writes every operation applied meanwhile,
paced by the changes' deadlines and the job's write budget (docs/architecture.md)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
from pydantic import BaseModel

from antdt.runtime.bus import Rejected
from antdt.runtime.recent import Recent
from antdt.schemas import ErrorCode, ShardReply
from antdt.services.shards.budget import WriteBudget
from antdt.services.shards.change import LedgerChange, Operation, Writes
from antdt.services.shards.early import Stored, early_reply
from antdt.services.shards.ledger import LedgerState
from antdt.services.shards.pending import Applied, PendingJob, answer, fail, idle
from antdt.services.shards.stored import Committed, LedgerStore, Snapshot

log = structlog.get_logger("antdt.shards.committer")
#: Loop turns a write waits before it starts, so that it carries the requests that
#: arrived together (one turn from a message read off the socket to its handler's
#: enqueue; a second costs microseconds).
GATHER_TURNS = 2
#: Completed jobs whose end a replica remembers after their ledger left its cache.
MAX_COMPLETED = 4096
Spawn = Callable[[str, Coroutine[Any, Any, None]], "asyncio.Task[None]"]


class Committer:
    """Applies each job's operations as they come; writes them behind, in batches."""

    def __init__(
        self,
        store: LedgerStore,
        spawn: Spawn,
        *,
        retries: int = 20,
        max_writes: int = 100,
        flush_interval_s: float = 0.015,
        done_flush_interval_s: float = 0.025,
        write_bytes_per_s: float = 0.0,
        write_burst_s: float = 1.0,
    ) -> None:
        self.store = store
        self._spawn = spawn
        self.retries = retries
        self.max_writes = max_writes
        self.flush_interval_s = flush_interval_s
        self.done_flush_interval_s = max(flush_interval_s, done_flush_interval_s)
        self.write_bytes_per_s = write_bytes_per_s  # 0: no budget
        self.write_burst_s = write_burst_s  # the bucket holds this many seconds of budget
        self._jobs: dict[str, PendingJob] = {}
        # (incarnation, epoch) of the jobs this replica last wrote complete, forgotten
        # from the cache with that write: their end can still be announced.
        self._completed: Recent[tuple[int, int]] = Recent(MAX_COMPLETED)
        self._closed = False
        self.commits = 0  # successful transactions (writes or compare-only checks)
        self.committed = 0  # operations made durable by them
        self.early = 0  # operations answered before their write
        self.early_revised = 0  # early answers whose operation came out differently on a retry
        self.cas_conflicts = 0
        self.batch_sizes: Counter[int] = Counter()
        self.apply_seconds = 0.0  # in the pure ledger operations
        self.store_seconds = 0.0  # waiting on the store's transactions
        self.written_bytes = 0  # values written by successful transactions
        self.budget_waits = 0  # writes held back by the write budget

    @property
    def requests_per_commit(self) -> float:
        return self.committed / self.commits if self.commits else 0.0

    @property
    def cache(self) -> dict[str, Snapshot]:
        """The stored ledgers this replica knows, by job."""
        return {job: j.stored for job, j in self._jobs.items() if j.stored is not None}

    def working(self, job: str) -> LedgerState | None:
        """`job`'s working ledger (what the next operation is applied to), if loaded."""
        j = self._jobs.get(job)
        return j.working if j is not None else None

    def completed(self, job: str) -> tuple[int, int] | None:
        """(incarnation, last epoch) of `job`, if a write here completed it and its ledger
        has left the cache since."""
        return self._completed.get(job) if job not in self._jobs else None

    def unwritten(self, job: str) -> int:
        """Operations of `job` applied or queued here and not yet written."""
        j = self._jobs.get(job)
        return len(j.applied) + len(j.waiting) if j is not None else 0

    def enqueue(self, job: str, op: Operation) -> asyncio.Future[BaseModel]:
        """Apply `op` to `job`'s ledger; the future resolves with its reply when it may
        be sent (early, or once durable), or with Rejected."""
        if self._closed:
            raise Rejected(ErrorCode.UNAVAILABLE, "shards replica shutting down; retry")
        future: asyncio.Future[BaseModel] = asyncio.get_running_loop().create_future()
        j = self._jobs.get(job)
        if j is None:
            j = self._jobs[job] = PendingJob()
        j.used = time.monotonic()
        if j.working is None:
            j.waiting.append((op, future))
            j.urgent = True
        else:
            self._apply(j, op, future)
        if j.task is None:
            j.task = self._spawn(f"commit-{job}", self._run(job, j))
        return future

    def idle_jobs(self, now: float, idle_s: float) -> list[str]:
        """Jobs with nothing unwritten or in progress and no operation since
        `now - idle_s` (monotonic seconds)."""
        return [job for job, j in self._jobs.items() if idle(j, now, idle_s)]

    def forget(self, job: str, now: float, idle_s: float) -> bool:
        """Drop `job`'s cached ledger if it is still idle (see idle_jobs); the next
        operation loads it from the store again. Returns whether it was dropped."""
        j = self._jobs.get(job)
        if j is None or not idle(j, now, idle_s):
            return False
        del self._jobs[job]
        return True

    async def submit(self, job: str, op: Operation) -> BaseModel:
        """Apply `op` to `job`'s ledger; returns its reply, raises Rejected for an
        ErrorReply (or `busy` / `unavailable` when it could not be committed)."""
        return await self.enqueue(job, op)

    async def finish(self) -> None:
        """Refuse new operations; write and answer everything applied or queued."""
        self._closed = True
        for j in self._jobs.values():
            j.urgent = True
            j.wake.set()
        tasks = [j.task for j in self._jobs.values() if j.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- applying -----------------------------------------------------------------------

    def _apply(self, j: PendingJob, op: Operation, future: asyncio.Future[BaseModel]) -> None:
        assert j.working is not None and j.index is not None
        started = time.perf_counter()
        try:
            change = op(j.working)
        except Exception as exc:  # a bug in one operation must not fail its neighbours
            log.exception("ledger operation failed")
            future.set_exception(exc)
            return
        finally:
            self.apply_seconds += time.perf_counter() - started
        interval = self._interval(change)
        due = time.monotonic() + interval
        if due < j.due:
            j.due = due
            j.wake.set()
        j.applied.append(Applied(op, change, future, interval))
        if not change.rejected:
            j.working = change.state
        reply = self._early_reply(j, change)
        if reply is not None:
            self.early += 1
            future.set_result(reply)
        elif not j.urgent:
            j.urgent = True
            j.wake.set()

    def _interval(self, change: LedgerChange) -> float:
        """How long a change answered early may wait for its write: shards reserved
        ahead must be durable before their rank reaches them (it waits for the write
        otherwise), done marks only eventually (the rank reports them again)."""
        return self.flush_interval_s if change.reserved else self.done_flush_interval_s

    @staticmethod
    def _early_reply(j: PendingJob, change: LedgerChange) -> BaseModel | None:
        if change.early is None or not isinstance(change.reply, ShardReply):
            return None
        assert j.index is not None
        return early_reply(change.reply, change.early, j.index)

    def _reapply(self, j: PendingJob) -> None:
        """Apply every unwritten operation again, in order, to the stored ledger."""
        assert j.stored is not None
        state = j.stored.state
        kept = []
        for entry in j.applied:
            try:
                change = entry.op(state)
            except Exception as exc:
                log.exception("ledger operation failed")
                fail(entry.future, exc)
                continue
            revised = entry.future.done() and change.reply != entry.change.reply
            if revised and self._early_reply(j, change) is None:
                self.early_revised += 1
                log.warning(
                    "an early answer came out differently on the stored ledger",
                    reply=str(change.reply)[:200],
                )
            entry.change = change
            kept.append(entry)
            if not change.rejected:
                state = change.state
        j.applied, j.working = kept, state

    # -- writing ------------------------------------------------------------------------

    async def _run(self, job: str, j: PendingJob) -> None:
        try:
            while j.applied or j.waiting:  # else a new operation starts a new task
                if j.working is None and not await self._load(job, j):
                    return
                await self._pace(j)
                await self._flush(job, j)
        finally:
            j.task = None  # no await between the empty check and here: none is lost
            gone = Rejected(ErrorCode.UNAVAILABLE, "shards replica shutting down; retry")
            for entry in j.applied:  # cancelled mid-write: the outcome is unknown
                fail(entry.future, gone)
            for _, future in j.waiting:
                fail(future, gone)
            j.applied.clear()
            j.waiting.clear()
            j.due = math.inf
            if j.stored is not None and j.stored.state.complete:
                # A finished job's ledger never changes again: a late request reloads it.
                done = j.stored.state
                self._completed.put(job, (done.incarnation, done.epoch))
                self._jobs.pop(job, None)

    async def _load(self, job: str, j: PendingJob) -> bool:
        try:
            j.rebase(await self.store.load(job))
        except Exception as exc:  # unknown_job, or etcd unreachable
            error = exc if isinstance(exc, Rejected) else _unavailable(job, exc)
            for entry in j.applied:
                fail(entry.future, error)
            for _, future in j.waiting:
                fail(future, error)
            j.applied.clear()
            j.waiting.clear()
            self._jobs.pop(job, None)
            return False
        self._reapply(j)
        while j.waiting:
            op, future = j.waiting.popleft()
            if not future.done():  # its requester gave up (cancelled)
                self._apply(j, op, future)
        return True

    async def _pace(self, j: PendingJob) -> None:
        """Let the requests that arrived together join; then wait for an answer that
        needs the write, or the flush interval, whichever comes first; and in any case
        until the write budget allows the next write."""
        for _ in range(GATHER_TURNS):
            await asyncio.sleep(0)
        held = False
        budget_due = j.budget.due() if j.budget is not None else 0.0
        while not self._closed:
            now = time.monotonic()
            interval_due = now if j.urgent else j.due
            due = max(budget_due, interval_due)
            if due <= now:
                return
            if budget_due > interval_due and not held:
                held = True  # counted once per write
                self.budget_waits += 1
            j.wake.clear()
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(j.wake.wait(), due - now)

    def _prefix(self, j: PendingJob) -> int:
        """How many unwritten operations the next write carries: all, unless their extra
        keys exceed what etcd takes in one transaction (the first always goes)."""
        keys: set[str] = set()
        for count, entry in enumerate(j.applied):
            change = entry.change
            if change.rejected or not (change.puts or change.deletes):
                continue  # a fetch: no extra key (no set built for each of a write's many)
            extra = {k for k, _ in change.puts} | set(change.deletes)
            if count and len(keys | extra) > self.max_writes:
                return count
            keys |= extra
        return len(j.applied)

    async def _flush(self, job: str, j: PendingJob) -> None:
        for attempt in range(self.retries):
            assert j.stored is not None
            count = self._prefix(j)
            batch = j.applied[:count]
            writes = Writes()
            for entry in batch:
                if not entry.change.rejected:
                    writes.add(entry.change)
            state = batch[-1].change.state if batch else j.stored.state
            changed = state is not j.stored.state and state != j.stored.state
            if not changed and not len(writes) and all(e.future.done() for e in batch):
                del j.applied[:count]  # answered, and nothing to write
                self._settle(j)
                return
            started = time.perf_counter()
            try:
                done = await self.store.commit(job, j.stored, state if changed else None, writes)
            except Rejected as exc:  # the store refused before sending (too_large)
                log.error("ledger commit refused", job=job, code=exc.code, reason=exc.reason)
                self._give_up(j, exc)
                return
            except Exception as exc:  # etcd unreachable or refusing: the outcome is unknown
                log.warning("ledger commit failed", job=job, error=repr(exc))
                self._give_up(j, _unavailable(job, exc))
                return
            finally:
                self.store_seconds += time.perf_counter() - started
            if done.ok:
                self._written(j, batch, done)
                return
            self.cas_conflicts += 1
            if done.snapshot is None:
                j.working = None  # reloaded (and re-applied) by the run loop
                return
            j.rebase(done.snapshot)
            self._reapply(j)
            # Two replicas writing the same job every few milliseconds can keep beating
            # each other to it: back off (jittered) so one of them gets a turn.
            await asyncio.sleep(random.uniform(0, min(0.0005 * 2**attempt, 0.02)))
        self._give_up(j, Rejected(ErrorCode.BUSY, f"ledger of {job!r} contended; retry"))

    def _written(self, j: PendingJob, batch: list[Applied], done: Committed) -> None:
        self.commits += 1
        self.committed += len(batch)
        self.batch_sizes[len(batch)] += 1
        self.written_bytes += done.written_bytes
        if self.write_bytes_per_s > 0:
            if j.budget is None:
                j.budget = WriteBudget(self.write_bytes_per_s, self.write_burst_s)
            j.budget.spend(done.written_bytes, time.monotonic())
        del j.applied[: len(batch)]
        for entry in batch:
            answer(entry)
        if done.snapshot is None:
            j.working = None  # written, but its token is unknown: reload
        else:
            assert j.stored is not None
            j.stored, j.index = done.snapshot, Stored(done.snapshot.state)
        self._settle(j)

    def _settle(self, j: PendingJob) -> None:
        """After a write: is another one due at once?"""
        j.urgent = any(not e.future.done() for e in j.applied)
        intervals = [e.interval for e in j.applied]
        j.due = time.monotonic() + min(intervals) if intervals else math.inf

    def _give_up(self, j: PendingJob, error: Exception) -> None:
        for entry in j.applied:
            fail(entry.future, error)
        j.applied.clear()
        j.working = None  # reload before the next operation is applied
        j.stored = j.index = None
        j.urgent, j.due = False, math.inf


def _unavailable(job: str, exc: Exception) -> Rejected:
    return Rejected(ErrorCode.UNAVAILABLE, f"ledger store unavailable: {type(exc).__name__}")
