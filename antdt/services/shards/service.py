"""Shards service shell: done-and-fetch over request/reply in a queue group, ledger in etcd.

Every replica serves every job. Each ledger change goes through the per-job
write-behind committer (committer.py): concurrent requests of a job share one
compare-and-swap transaction on the ledger key. A fetch that only hands out shards
already granted to its rank in etcd (reserved ahead) is answered at once, its done marks
written behind; everything else is answered once durable (early.py says which is
which). Two replicas can never grant the same shard twice: a replica whose cached
ledger is stale fails the compare, re-applies its unwritten operations to the state
read back in the same transaction, retries. Ranks still keep to one replica per job
when they can (routing.py): each fetch reply names the job's owner, whose own subject
the agent uses next, so that two replicas rarely write one ledger at once.

Fetches and commits are handled concurrently (`fetch_concurrency` at once per subject,
each a task of its own): a request waits for the write that carries it, and a write
carries every request waiting, so this bounds how many one write serves. When every rank
of a job of 10^4 ranks committed a checkpoint at once, 64 at a time per subject (one per
nats-py subscription, as before) made the checkpoint take 118 s in `make bench`; with
1024, 20-30 s on the 2-core machine."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import BaseModel, Field

from antdt.runtime.bus import Bus, Delivery, Rejected
from antdt.runtime.config import ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.recent import Recent
from antdt.runtime.store import Compare, Delete, Get, Op, Put, Store, Versioned
from antdt.runtime.telemetry import metrics
from antdt.schemas import (
    CheckpointCompleted,
    CommitReply,
    EpochFinished,
    ErrorCode,
    FetchStatus,
    JobSpec,
    Keys,
    ReleaseReply,
    RestoreReply,
    ShardCommit,
    ShardFetch,
    ShardRelease,
    ShardReply,
    ShardRestore,
    ShardsReturned,
    ShardStatus,
    ShardStatusRequest,
    Subjects,
    replaced,
)
from antdt.services.shards.change import LedgerChange, Operation, Writes
from antdt.services.shards.checkpoints import DEFAULT_KEEP
from antdt.services.shards.committer import Committed, Committer, Snapshot
from antdt.services.shards.handbacks import HandBacks
from antdt.services.shards.ledger import (
    LedgerState,
    epoch_end_to_announce,
    new_ledger,
    plan_fetch,
    status,
)
from antdt.services.shards.ops import commit_op, encode, release_op
from antdt.services.shards.restores import Restores
from antdt.services.shards.routing import Routes

log = structlog.get_logger("antdt.shards")
QUEUE_GROUP = "antdt-shards"
VERBS = ("fetch", "commit", "restore", "release", "status")
#: Jobs whose last epoch announced a replica remembers, at most (the least recent go).
MAX_ANNOUNCED = 4096
#: Seconds, at least, between two hand-back announcements of a job (see handbacks.py).
RETURNED_EVERY_S = 1.0


class ShardsSettings(ServiceSettings):
    cas_retries: int = Field(default=20, ge=1, description="Ledger CAS attempts per batch")
    checkpoints_kept: int = Field(
        default=DEFAULT_KEEP, ge=2, le=100, description="Ledger snapshots kept per job"
    )
    fetch_concurrency: int = Field(
        default=1024,
        ge=1,
        le=65536,
        description="Fetch (and, apart, commit) requests one replica handles at once, per "
        "subject: the most one ledger write can carry when every rank asks at once",
    )
    flush_interval_s: float = Field(
        default=0.015,
        ge=0,
        le=1.0,
        description="Seconds, at most, between a change whose answer went out early and "
        "that granted shards ahead of need (a reservation) and its write; changes someone "
        "waits on are written at once. A reservation is topped up while its rank still "
        "holds half of it, so it is durable long before the rank reaches it; a rank that "
        "gets there first waits for the write, which then starts at once",
    )
    done_flush_interval_s: float = Field(
        default=0.025,
        ge=0,
        le=1.0,
        description="Seconds, at most, between a change whose answer went out early and "
        "that only marked shards done and its write (never less than flush_interval_s): "
        "ranks report such marks again until a reply says they are durable, so waiting "
        "longer loses nothing and lets one write carry more requests",
    )
    ledger_write_bytes_per_s: float = Field(
        default=1024**2,
        ge=0,
        description="Bytes per second that one job's ledger writes to etcd, on average "
        "over ledger_write_burst_s: past it a write waits, and carries every request that "
        "came meanwhile. Each write is the whole ledger (about 14-20 bytes per shard in "
        "flight) and stays in etcd's history until etcd compacts it; 0: no limit",
    )
    ledger_write_burst_s: float = Field(
        default=1.0,
        ge=0,
        le=60,
        description="Seconds of ledger_write_bytes_per_s a job may write in a burst before "
        "its writes are paced (0: every write waits its own bytes' worth)",
    )
    idle_job_s: float = Field(
        default=600.0,
        ge=0.05,
        description="Seconds without a request after which this replica drops a job: its "
        "cached ledger and its ownership (the next request loads and claims it again)",
    )
    max_txn_bytes: int = Field(
        default=1_500_000,
        ge=10_000,
        description="Bytes, at most, of keys and values in one ledger transaction. Keep it "
        "under etcd's --max-request-bytes (1.5 MiB by default): etcd refuses a larger "
        "request, and a ledger that outgrew it could never be written again. A change "
        "past it is refused with code too_large, naming the sizes, and nothing is written",
    )
    reserve_shards: int = Field(
        default=64,
        ge=0,
        le=256,
        description="Shards granted to a rank ahead of its asking (capped near the end of "
        "an epoch), so that handing them out needs no etcd write; 0: never",
    )


@dataclass(frozen=True)
class _Revision:
    """CAS token of a stored ledger. (create revision, version) names one value of the
    key, as the mod revision would, but is known after a write without reading the
    (possibly large) value back. create == 0: the key does not exist yet."""

    create: int
    version: int


class EtcdLedgers:
    """The committer's store: one etcd key per job's ledger, JSON."""

    def __init__(self, store: Store, keys: Keys, max_txn_bytes: int = 1_500_000) -> None:
        self.store = store
        self.keys = keys
        self.max_txn_bytes = max_txn_bytes

    async def load(self, job: str) -> Snapshot:
        stored = await self.store.get(self.keys.ledger(job))
        if stored is not None:
            return _snapshot(stored)
        return Snapshot(await self.fresh(job), _Revision(0, 0))

    async def fresh(self, job: str) -> LedgerState:
        """The ledger of the job's start, from its spec; Rejected if it is not registered."""
        spec = await self.store.get_model(self.keys.spec(job), JobSpec)
        if spec is None:
            raise Rejected(ErrorCode.UNKNOWN_JOB, f"job {job!r} is not registered")
        return new_ledger(spec[0])

    async def snapshot(self, job: str, step: int) -> LedgerState | None:
        """The ledger snapshot of checkpoint `step`, None if it is not kept."""
        stored = await self.store.get_model(self.keys.ledger_checkpoint(job, step), LedgerState)
        return stored[0] if stored is not None else None

    async def commit(
        self, job: str, base: Snapshot, state: LedgerState | None, writes: Writes
    ) -> Committed:
        key = self.keys.ledger(job)
        revision: _Revision = base.token
        puts = writes.puts()
        success: list[Op] = [Put(k, v) for k, v in puts]
        success += [Delete(k) for k in writes.deletes()]
        written = sum(len(v) for _, v in puts)
        if state is not None:
            encoded = encode(state)
            written += len(encoded)
            success.append(Put(key, encoded))
            if revision.create == 0:
                success.append(Get(key))  # the new key's create revision: the next token
        size = written + sum(len(op.key) for op in success) + len(key)  # + the compare
        if size > self.max_txn_bytes:
            raise Rejected(
                ErrorCode.TOO_LARGE,
                f"the ledger of job {job!r} would take a {size:,}-byte etcd transaction, "
                f"over max_txn_bytes ({self.max_txn_bytes:,}): nothing was written. Raise "
                "etcd's --max-request-bytes and the shards service's max_txn_bytes together, "
                "or have the ranks hold fewer shards each (prefetch)",
            )
        result = await self.store.txn(_unchanged(key, revision), success, [Get(key)])
        if not result.succeeded:
            current = result.gets[0] if result.gets else None
            return Committed(False, _snapshot(current) if current is not None else None)
        if state is None:
            return Committed(True, base, written)
        if revision.create == 0:
            created = result.gets[-1]
            if created is None:
                return Committed(True, None, written)
            token = _Revision(created.create_revision, 1)
        else:
            token = _Revision(revision.create, revision.version + 1)
        return Committed(True, Snapshot(state, token), written)


def _unchanged(key: str, revision: _Revision) -> list[Compare]:
    if revision.create == 0:
        return [Compare.absent(key)]
    return [Compare(key, "create", revision.create), Compare(key, "version", revision.version)]


def _snapshot(stored: Versioned) -> Snapshot:
    state = LedgerState.model_validate_json(stored.value)
    return Snapshot(state, _Revision(stored.create_revision, stored.version))


def fetch_op(req: ShardFetch, reserve: int = 0) -> Operation:
    """A ShardFetch as a ledger operation."""

    def op(state: LedgerState) -> LedgerChange:
        result = plan_fetch(state, req, reserve)
        return LedgerChange(
            state=result.state, reply=result.reply, early=result.early, reserved=result.reserved
        )

    return op


class ShardsService:
    def __init__(self, settings: ShardsSettings, bus: Bus, store: Store) -> None:
        self.settings = settings
        self.bus = bus
        self.store = store
        self.subjects = Subjects(settings.nats.subject_prefix)
        self.keys = Keys(settings.etcd.key_prefix)
        self.ledgers = EtcdLedgers(store, self.keys, settings.max_txn_bytes)
        self._runtime: ServiceRuntime | None = None
        self.routes = Routes(store, settings, self._spawn)
        self.idle_dropped = 0  # jobs forgotten after idle_job_s without a request
        # Valid requests handled, by verb: every key there from the start, so that the
        # metrics' thread reads a dict that never changes size (and rates start at 0).
        self.requests: Counter[str] = Counter(dict.fromkeys(VERBS, 0))
        self.committer = Committer(
            self.ledgers,
            self._spawn,
            retries=settings.cas_retries,
            flush_interval_s=settings.flush_interval_s,
            done_flush_interval_s=settings.done_flush_interval_s,
            write_bytes_per_s=settings.ledger_write_bytes_per_s,
            write_burst_s=settings.ledger_write_burst_s,
        )
        self.restores = Restores(self.ledgers, self.keys, self.committer)
        # job -> (incarnation, epoch) whose end this replica announced (EpochFinished).
        self._epoch_announced: Recent[tuple[int, int]] = Recent(MAX_ANNOUNCED)
        # Hand-backs to announce (ShardsReturned), at most once a second per job.
        self.hand_backs = HandBacks(every_s=RETURNED_EVERY_S)
        metrics.watch_shards(self)

    @property
    def cas_conflicts(self) -> int:
        return self.committer.cas_conflicts

    def counters(self) -> dict[str, float]:
        """For the metrics (read from their thread): see metrics.SHARDS_COUNTERS."""
        c = self.committer
        figures: dict[str, float] = {
            "commits": c.commits,
            "committed": c.committed,
            "early": c.early,
            "conflicts": c.cas_conflicts,
            "store_s": c.store_seconds,
            "written_bytes": c.written_bytes,
            "budget_waits": c.budget_waits,
        }
        figures.update({f"requests.{verb}": n for verb, n in self.requests.items()})
        return figures

    def owned_ledgers(self) -> list[metrics.LedgerFigures]:
        """The cached ledgers of the jobs this replica owns (read from the metrics'
        thread): only the owner reports a job, so that no stale copy shows beside it."""
        cached: list[tuple[str, Snapshot]] = []
        with contextlib.suppress(RuntimeError):  # a job cached or dropped meanwhile
            cached = list(self.committer.cache.items())
        return [
            metrics.LedgerFigures(
                job=job,
                epoch=s.state.epoch,
                incarnation=s.state.incarnation,
                done=s.state.done_count,
                todo=s.state.todo_count,
                in_flight=len(s.state.in_flight),
            )
            for job, s in cached
            if self.routes.ownership.owns(job)
        ]

    async def start(self, runtime: ServiceRuntime) -> None:
        self._runtime = runtime
        many = self.settings.fetch_concurrency  # every rank fetches, and commits at once
        verbs: list[tuple[str, type[BaseModel], Any, int]] = [
            ("fetch", ShardFetch, self._on_fetch, many),
            ("commit", ShardCommit, self._on_commit, many),
            ("restore", ShardRestore, self._on_restore, many),
            ("release", ShardRelease, self._on_release, 1),
        ]
        for verb, model, handler, count in verbs:
            # The shared subject, and our own for the ranks that follow our route.
            shared = self.subjects.any_job(f"shards.{verb}")
            direct = self.subjects.shards_direct("*", verb, self.routes.token)
            for subject in (shared, direct):
                await self.bus.subscribe(
                    subject, model, handler, queue=QUEUE_GROUP, concurrency=count
                )
        await self.bus.subscribe(
            self.subjects.any_job("shards.status"),
            ShardStatusRequest,
            self._on_status,
            queue=QUEUE_GROUP,
        )
        # Draining the bus waits for handlers, which wait for their commits; then the
        # committer refuses new work and waits for whatever is still queued.
        runtime.on_shutdown("drain", self.bus.drain)
        runtime.on_shutdown("finish", self.committer.finish)
        runtime.on_shutdown("revoke", self.routes.stop)
        runtime.spawn("owners", self.routes.follow())
        runtime.spawn("lease", self.routes.keep_lease())
        runtime.spawn("idle", self._drop_idle_jobs())
        log.info("shards service started", replica=self.settings.replica_id)

    async def _drop_idle_jobs(self) -> None:
        """Run as a task: forget the jobs nobody asked about for `idle_job_s`."""
        idle_s = self.settings.idle_job_s
        while True:
            await asyncio.sleep(min(idle_s / 4, 30.0))
            now = time.monotonic()
            for job in self.committer.idle_jobs(now, idle_s):
                if self.committer.forget(job, now, idle_s):
                    self.idle_dropped += 1
                    log.info("idle job dropped", job=job, idle_s=idle_s)
                    await self.routes.forget(job)

    async def submit(self, job: str, op: Operation) -> BaseModel:
        """Apply `op` to `job`'s ledger through the group committer. Returns the reply
        once the change is durable in etcd; raises Rejected(code, reason) for an
        ErrorReply, and `busy` / `unavailable` when it could not be committed."""
        return await self.committer.submit(job, op)

    def _spawn(self, name: str, coro: Any) -> Any:
        if self._runtime is None:
            raise RuntimeError("ShardsService.start() has not run")
        return self._runtime.spawn(name, coro)

    def _check_subject(self, job: str, delivery: Delivery) -> None:
        if self.subjects.job_of(delivery.subject) != job:
            raise Rejected(ErrorCode.BAD_REQUEST, f"job {job!r} does not match the subject")

    async def _on_fetch(self, req: ShardFetch, delivery: Delivery) -> BaseModel:
        self._check_subject(req.job, delivery)
        self.requests["fetch"] += 1
        reply = await self.submit(req.job, fetch_op(req, self.settings.reserve_shards))
        if not isinstance(reply, ShardReply):
            raise TypeError(f"fetch answered {type(reply).__name__}")
        await self._announce_epoch_end(req.job)
        route = self.routes.route(req.job, finished=reply.status is FetchStatus.JOB_DONE)
        return replaced(reply, {"route": route}) if route else reply

    async def _on_commit(self, req: ShardCommit, delivery: Delivery) -> BaseModel:
        self._check_subject(req.job, delivery)
        self.requests["commit"] += 1
        op = commit_op(req, self.keys, self.settings.checkpoints_kept)
        reply = await self.submit(req.job, op)
        if isinstance(reply, CommitReply) and reply.completed_now:  # durable: announce it
            await self._announce(reply)
        await self._announce_epoch_end(req.job)  # its done refs may have been the last
        return reply

    async def _announce(self, reply: CommitReply) -> None:
        """Tell the job's waiting ranks that checkpoint `reply.step` is complete. Best
        effort: a rank that misses it learns the same at its next poll."""
        event = CheckpointCompleted(job=reply.job, step=reply.step, checkpoints=reply.checkpoints)
        try:
            await self.bus.publish(self.subjects.checkpointed(reply.job), event)
        except Exception as exc:  # NATS away: the reply itself still goes out
            log.warning("checkpoint not announced", job=reply.job, step=reply.step, error=repr(exc))
        else:
            log.info("checkpoint complete", job=reply.job, step=reply.step)

    async def _announce_epoch_end(self, job: str) -> None:
        """Tell the job's ranks that an epoch is finished, once per epoch here, as soon as
        the working ledger says so (`epoch_end_to_announce`): the ranks waiting for the
        next epoch, or for the job's end, ask at once (their requests are judged on the
        same working ledger, and a grant of the new epoch is answered only once durable).
        The write that completes a job drops its ledger from the cache, which remembers
        that end (`completed`), whether a fetch or a commit's done refs made it. Best
        effort: a rank that misses it asks at its next poll (`pending_retry_s`)."""
        state = self.committer.working(job)
        if state is None:
            key = self.committer.completed(job)
        else:
            epoch = epoch_end_to_announce(state)
            key = None if epoch is None else (state.incarnation, epoch)
        if key is None:  # an epoch under way: every fetch of its body ends here
            return
        told = self._epoch_announced.get(job)
        if told is not None and told >= key:
            return
        self._epoch_announced.put(job, key)
        incarnation, epoch = key
        event = EpochFinished(job=job, epoch=epoch, incarnation=incarnation)
        try:
            await self.bus.publish(self.subjects.epoch_finished(job), event)
        except Exception as exc:  # NATS away: the ranks poll
            log.warning("epoch end not announced", job=job, epoch=epoch, error=repr(exc))

    async def _on_restore(self, req: ShardRestore, delivery: Delivery) -> BaseModel:
        """Every rank of a restarted job sends one; restores.py reads what the first
        needs once, and answers the rest from the ledger."""
        self._check_subject(req.job, delivery)
        self.requests["restore"] += 1
        reply = await self.restores.submit(req)
        if isinstance(reply, RestoreReply) and reply.restored:
            log.info("ledger restored", job=req.job, step=req.step, rank=req.rank,
                     incarnation=reply.incarnation)  # fmt: skip
        return reply

    async def _on_release(self, req: ShardRelease, delivery: Delivery) -> BaseModel:
        self._check_subject(req.job, delivery)
        self.requests["release"] += 1
        reply = await self.submit(req.job, release_op(req, self.keys))
        log.info("rank released", job=req.job, rank=req.rank, reason=req.reason)
        if isinstance(reply, ReleaseReply) and reply.returned:  # durable: announce it
            delay = self.hand_backs.add(req.job, req.rank, reply.returned, time.monotonic())
            if delay == 0:
                await self._announce_returned(req.job)
            elif delay is not None:  # within a second of the last one: at its end (one
                # still waiting at shutdown is cancelled with the runtime's tasks: ranks poll)
                self._spawn(f"returned-{req.job}", self._announce_returned(req.job, delay))
        await self._announce_epoch_end(req.job)
        return reply

    async def _announce_returned(self, job: str, after_s: float = 0.0) -> None:
        """Tell the job's ranks that shards came back (what `hand_backs` holds): those
        waiting to leave the epoch ask again at once. Best effort: they poll
        (`pending_retry_s`)."""
        if after_s:
            await asyncio.sleep(after_s)
        held = self.hand_backs.take(job, time.monotonic())
        if held is None:
            return
        event = ShardsReturned(job=job, ranks=tuple(held.ranks), returned=held.returned)
        try:
            await self.bus.publish(self.subjects.shards_returned(job), event)
        except Exception as exc:  # NATS away: the ranks poll
            log.warning("hand-back not announced", job=job, ranks=held.ranks, error=repr(exc))

    async def _on_status(self, req: ShardStatusRequest, delivery: Delivery) -> ShardStatus:
        self._check_subject(req.job, delivery)
        self.requests["status"] += 1
        # Fresh from etcd, not the committer's cache: another replica may have written.
        ledger = status((await self.ledgers.load(req.job)).state, req.ranks, req.limit)
        owner = await self.routes.ownership.owner_of(req.job)
        return ledger.model_copy(update={"owner": owner}) if owner else ledger
