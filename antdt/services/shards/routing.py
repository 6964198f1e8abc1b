"""Job affinity between shards replicas: which replica a job's ranks should ask. A job's
owner holds `owners/shards/{job}` (bound to its lease); fetch replies name its route and
the agent asks it directly. Ownership only steers the ranks: any replica serves any
request. A completed job, or one idle for `idle_job_s`, is given up."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from antdt.runtime.config import ServiceSettings
from antdt.runtime.coordination.ownership import Ownership
from antdt.runtime.store import Store, StoredValueInvalid, decode_text
from antdt.schemas import Keys, route_token

log = structlog.get_logger("antdt.shards.routing")
SERVICE = "shards"
#: Seconds between two claims of one job by this replica when the last one failed
#: (etcd away): requests keep coming, claims should not.
CLAIM_RETRY_S = 1.0
Spawn = Callable[[str, Coroutine[Any, Any, None]], "asyncio.Task[None]"]


class Routes:
    """The replica's view of who owns which job, and its own claims."""

    def __init__(self, store: Store, settings: ServiceSettings, spawn: Spawn) -> None:
        self.store = store
        self.keys = Keys(settings.etcd.key_prefix)
        self.ownership = Ownership.for_service(store, settings, SERVICE)
        self.token = route_token(settings.replica_id)
        self._spawn = spawn
        self._owners: dict[str, str] = {}  # job -> its owner's route token, as etcd says
        self._claiming: set[str] = set()
        self._claim_after: dict[str, float] = {}  # job -> monotonic time of the next try
        self.claims = 0  # jobs this replica acquired

    def route(self, job: str, *, finished: bool = False) -> str:
        """The route token to answer a request of `job` with ("" if none is known yet:
        a claim starts). `finished`: the job's ledger is complete; the owner gives it
        up and nobody claims it again."""
        if finished:
            if self.ownership.owns(job):
                self._spawn(f"release-{job}", self._release(job))
            return ""
        if self.ownership.owns(job):
            return self.token
        owner = self._owners.get(job)
        if owner is None:
            self._claim_soon(job)
            return ""
        return owner

    def _claim_soon(self, job: str) -> None:
        if job in self._claiming or self._claim_after.get(job, 0.0) > time.monotonic():
            return
        self._claiming.add(job)
        self._spawn(f"claim-{job}", self._claim(job))

    async def _claim(self, job: str) -> None:
        try:
            if await self.ownership.try_acquire(job):
                self.claims += 1
                self._claim_after.pop(job, None)
                return
            owner = await self.ownership.owner_of(job)
            if owner is not None:
                self._owners[job] = route_token(owner)
        except Exception as exc:  # etcd away: serve without a route, try again later
            log.info("job claim failed", job=job, error=repr(exc))
            self._claim_after[job] = time.monotonic() + CLAIM_RETRY_S
        finally:
            self._claiming.discard(job)

    async def forget(self, job: str) -> None:
        """Give `job` up (idle): release it if ours, forget any claim backoff."""
        self._claim_after.pop(job, None)
        await self._release(job)

    async def _release(self, job: str) -> None:
        with contextlib.suppress(Exception):  # the lease's end removes the key anyway
            await self.ownership.release(job)

    async def follow(self) -> None:
        """Run as a task: keep the owners map equal to `owners/shards/`, whatever etcd
        does (the watch resumes after an outage; the first read is retried)."""
        prefix = self.keys.owners(SERVICE)
        async for event in self.store.follow_prefix(prefix, retry_s=CLAIM_RETRY_S):
            job = event.key[len(prefix) :]
            if event.kind != "put":
                self._owners.pop(job, None)
                continue
            try:
                self._owners[job] = route_token(decode_text(event.key, event.value))
            except StoredValueInvalid:  # not a replica's id: nobody routable owns it
                self._owners.pop(job, None)

    async def keep_lease(self) -> None:
        """Run as a task: drop our jobs the moment the lease lapses, then lease anew.
        Failures to lease (etcd away) are retried, never raised (`watch_lease`)."""
        await self.ownership.watch_lease()

    async def stop(self) -> None:
        """Revoke the lease: other replicas may claim our jobs at once (idempotent)."""
        with contextlib.suppress(Exception):
            await self.ownership.stop()
