"""Shards service shell: the ledger's requests over NATS (a queue group, and each replica's
own subjects for the jobs it owns), every change through the write-behind committer,
announcements to the job's ranks. Every replica serves every job; see
docs/architecture.md, "Data: the shards service and exactly-once samples"."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from typing import Any

import structlog
from pydantic import BaseModel

from antdt.runtime.bus import Bus, Delivery, Rejected
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.recent import Recent
from antdt.runtime.store import Store
from antdt.runtime.telemetry import metrics
from antdt.schemas import (
    CheckpointCompleted,
    CommitReply,
    EpochFinished,
    ErrorCode,
    FetchStatus,
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
from antdt.services.shards.change import Operation
from antdt.services.shards.committer import Committer
from antdt.services.shards.handbacks import HandBacks
from antdt.services.shards.ledger import (
    epoch_end_to_announce,
    status,
)
from antdt.services.shards.ops import commit_op, fetch_op, release_op
from antdt.services.shards.restores import Restores
from antdt.services.shards.routing import Routes
from antdt.services.shards.settings import ShardsSettings
from antdt.services.shards.stored import EtcdLedgers, Snapshot

log = structlog.get_logger("antdt.shards")
QUEUE_GROUP = "antdt-shards"
VERBS = ("fetch", "commit", "restore", "release", "status")
#: Jobs whose last epoch announced a replica remembers, at most (the least recent go).
MAX_ANNOUNCED = 4096
#: Seconds, at least, between two hand-back announcements of a job (see handbacks.py).
RETURNED_EVERY_S = 1.0


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
        backlog = {
            "pending_msgs": self.settings.request_backlog,
            "pending_bytes": self.settings.request_backlog_bytes,
        }
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
                    subject, model, handler, queue=QUEUE_GROUP, concurrency=count, **backlog
                )
        await self.bus.subscribe(
            self.subjects.any_job("shards.status"),
            ShardStatusRequest,
            self._on_status,
            queue=QUEUE_GROUP,
            **backlog,
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
        """Tell the job's ranks that an epoch is finished (EpochFinished), once per epoch here, as
        soon as the working ledger says so (`epoch_end_to_announce`), or a completed job's end
        the committer remembers. Best effort: a rank that misses it asks at its next poll."""
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
            log.info(
                "ledger restored",
                job=req.job,
                step=req.step,
                rank=req.rank,
                incarnation=reply.incarnation,
            )
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
