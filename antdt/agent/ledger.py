"""The agent's ledger requests besides fetching: commit at a checkpoint, restore on a
restart, release on leaving. On the agent's loop; the training thread waits. Each retries
through an outage of the service or of NATS until its deadline; a refusal other than
those in RETRIED_CODES is final, raised with the service's reason."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

import structlog

from antdt.agent.errors import AgentError
from antdt.agent.shards import Backoff, ShardStream
from antdt.runtime.bus import Bus, BusError, Delivery, RequestRefused
from antdt.schemas import (
    CheckpointCompleted,
    CommitReply,
    ErrorCode,
    ReleaseReply,
    RestoreReply,
    ShardRestore,
    WireModel,
)

log = structlog.get_logger("antdt.agent.ledger")
R = TypeVar("R", bound=WireModel)

#: A rank that committed asks again when the service announces the checkpoint complete
#: (CheckpointCompleted), and also after COMMIT_POLL_S, then at doubling intervals up to
#: COMMIT_POLL_MAX_S (seconds), in case the announcement is lost or the service is older.
COMMIT_POLL_S = 0.02
COMMIT_POLL_MAX_S = 1.0
#: Refusals a commit, restore or release retries until its deadline: the ledger
#: contended (`busy`), or the service could not reach etcd or is draining for a restart
#: (`unavailable`). All three requests are idempotent. Any other refusal is final.
RETRIED_CODES = frozenset({ErrorCode.BUSY, ErrorCode.UNAVAILABLE})
#: Checkpoint steps announced lately, remembered for a commit still on its way.
ANNOUNCED_KEPT = 16


class LedgerClient:
    def __init__(self, bus: Bus, stream: ShardStream) -> None:
        self._bus = bus
        self._stream = stream
        self._announced: deque[int] = deque(maxlen=ANNOUNCED_KEPT)
        self._announcement = asyncio.Event()

    async def on_checkpointed(self, event: CheckpointCompleted, delivery: Delivery) -> None:
        """Bus handler for the job's CheckpointCompleted announcements."""
        self._announced.append(event.step)
        self._announcement.set()

    async def _announced_or(self, step: int, timeout_s: float) -> None:
        """Return once checkpoint `step` is announced complete, or after `timeout_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while step not in self._announced:
            self._announcement.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._announcement.wait(), remaining)

    async def restore(self, req: ShardRestore, timeout_s: float) -> RestoreReply:
        deadline = time.monotonic() + timeout_s
        return await self._call("restore", lambda: req, RestoreReply, deadline)

    async def commit(self, step: int, timeout_s: float) -> CommitReply:
        """Commit this rank's part of the checkpoint at `step` and wait until every rank
        has (the snapshot is then durable). Re-sending is harmless: the service keeps the
        first commit of each rank."""
        deadline = time.monotonic() + timeout_s
        poll = COMMIT_POLL_S

        def request() -> WireModel:
            return self._stream.build(lambda s: s.commit_request(step))

        while True:
            reply = await self._call("commit", request, CommitReply, deadline)
            if reply.complete:
                return reply
            if time.monotonic() > deadline:
                waiting = reply.waiting or len(reply.waiting_for)  # older services: the list
                named = f" (ranks {list(reply.waiting_for)})" if reply.waiting_for else ""
                raise AgentError(
                    f"checkpoint {step}: {waiting} ranks{named} did not commit in {timeout_s:.0f} s"
                )
            # Jittered, so that ranks that committed together do not keep asking together.
            await self._announced_or(step, poll * random.uniform(0.75, 1.0))
            poll = min(poll * 2, COMMIT_POLL_MAX_S)

    async def release(self, reason: str, timeout_s: float) -> ReleaseReply:
        deadline = time.monotonic() + timeout_s

        def build() -> WireModel:
            return self._stream.build(lambda s: s.release_request(reason))

        return await self._call("release", build, ReleaseReply, deadline)

    async def _call(
        self, verb: str, build: Callable[[], WireModel], reply_type: type[R], deadline: float
    ) -> R:
        route = self._stream.route  # to the job's owner when the last fetch named one
        backoff = Backoff()
        while True:
            try:
                if not self._bus.connected:
                    raise BusError("not connected to NATS")
                timeout = max(0.1, min(5.0, deadline - time.monotonic()))
                subject = route.subject_for(verb)
                return await self._bus.request(subject, build(), reply_type, timeout=timeout)
            except RequestRefused as exc:
                if exc.reply.code not in RETRIED_CODES:
                    reason = f"{verb} refused ({exc.reply.code}): {exc.reply.error}"
                    raise AgentError(reason) from None
                problem = str(exc)
                route.on_failure(time.monotonic())
            except BusError as exc:
                problem = str(exc)
                route.on_failure(time.monotonic())
            if time.monotonic() > deadline:
                raise AgentError(f"{verb}: the shards service did not answer ({problem})")
            log.warning("ledger request failed, retrying", verb=verb, error=problem)
            await asyncio.sleep(backoff.next())
