"""Which replica acts for which job: an etcd key `owners/{service}/{job}` bound to the
replica's lease. Lease lost ⇒ ownership dropped at once (no acting on stale belief);
keys of a dead replica vanish with its lease, and any other replica can claim them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

from antdt.runtime.backoff import Backoff
from antdt.runtime.config import ServiceSettings
from antdt.runtime.store import Compare, Delete, Get, Lease, Put, Store, decode_text
from antdt.schemas import Keys

log = structlog.get_logger("antdt.ownership")
#: Waits between tries to lease while etcd is away (seconds), forever.
LEASE_RETRY = Backoff(first_s=0.25, max_s=5.0)
#: How often the deletes of released jobs' keys that failed are tried again (seconds).
RELEASE_RETRY_S = 1.0


class Ownership:
    def __init__(
        self,
        store: Store,
        keys: Keys,
        *,
        service: str,
        replica_id: str,
        ttl_s: int,
        max_jobs: int | None = None,
    ) -> None:
        self.store = store
        self.keys = keys
        self.service = service
        self.replica_id = replica_id
        self.ttl_s = ttl_s
        self.max_jobs = max_jobs
        self._lease: Lease | None = None
        self._owned: dict[str, int] = {}  # job -> create revision of our owner key
        # jobs given up whose key's delete failed: job -> its create revision (not owned)
        self._releasing: dict[str, int] = {}
        self._lost_callbacks: list[Callable[[str], Awaitable[None]]] = []
        self._stopped = False
        self._lease_lock = asyncio.Lock()

    @classmethod
    def for_service(
        cls, store: Store, settings: ServiceSettings, service: str, *, max_jobs: int | None = None
    ) -> Ownership:
        """The ownership of one replica of `service`, as its settings describe it."""
        return cls(
            store,
            Keys(settings.etcd.key_prefix),
            service=service,
            replica_id=settings.replica_id,
            ttl_s=settings.etcd.lease_ttl_s,
            max_jobs=max_jobs,
        )

    def on_lost(self, callback: Callable[[str], Awaitable[None]]) -> None:
        self._lost_callbacks.append(callback)

    def owns(self, job: str) -> bool:
        return job in self._owned

    @property
    def jobs(self) -> list[str]:
        return sorted(self._owned)

    def claim_revision(self, job: str) -> int:
        """The etcd revision at which we claimed `job` (0: not ours): unique per claim."""
        return self._owned.get(job, 0)

    def fence(self, job: str) -> Compare:
        """A transaction condition that holds only while we still own `job`."""
        return Compare(self.keys.owner(self.service, job), "create", self._owned.get(job, -1))

    async def _ensure_lease(self) -> Lease:
        # One at a time: the lease watcher and a claim may both find no lease, and two
        # grants would leave one lease kept alive for nothing, or watched instead of ours.
        async with self._lease_lock:
            if self._lease is None or self._lease.lost.is_set():
                if self._lease is not None:
                    await self._drop_all("lease lost")
                lease = await self.store.grant_lease(self.ttl_s)
                # Listed among the service's replicas for as long as this lease lives: a
                # lease without its member key is not kept (placement would skip us).
                member = self.keys.member(self.service, self.replica_id)
                try:
                    await self.store.put(member, b"", lease=lease)
                except BaseException:
                    await lease.revoke()
                    raise
                self._lease = lease
            return self._lease

    async def replicas(self) -> list[str]:
        """The service's live replicas (their member keys, bound to their leases), sorted."""
        prefix = self.keys.members(self.service)
        got = await self.store.get_prefix(prefix, keys_only=True)
        return sorted(kv.key[len(prefix) :] for kv in got)

    async def owned_by_anyone(self) -> set[str]:
        """The jobs some replica of the service owns now: one read, not one per job."""
        prefix = self.keys.owners(self.service)
        got = await self.store.get_prefix(prefix, keys_only=True)
        return {kv.key[len(prefix) :] for kv in got}

    async def try_acquire(self, job: str) -> bool:
        """Claim `job` if nobody owns it (or we already do). Never steals."""
        if self._stopped:
            return False
        lease = await self._ensure_lease()
        if job in self._owned:
            return True
        if self.max_jobs is not None and len(self._owned) >= self.max_jobs:
            return False
        key = self.keys.owner(self.service, job)
        # The Get in the same transaction gives the key's create revision (our fence for
        # release) without a second round trip, during which the key would already be
        # ours in etcd but not yet here.
        result = await self.store.txn(
            [Compare.absent(key)], [Put(key, self.replica_id.encode(), lease.id), Get(key)]
        )
        got = result.gets[0] if result.succeeded else None
        if got is None:
            return False
        if not self._current(lease):  # lost while the claim was in flight: its key goes
            log.info("claim outlived its lease", service=self.service, job=job)
            return False
        self._owned[job] = got.create_revision
        log.info("job acquired", service=self.service, job=job, replica=self.replica_id)
        return True

    async def release(self, job: str, settle: Callable[[], Awaitable[None]] | None = None) -> None:
        """Give `job` up: we stop owning it at once, and delete our key, if it is still
        ours, once `settle()` is done (what the next owner must find finished: it claims
        the job only after the key is gone). A `settle` that fails is logged. A delete
        that fails (etcd away) raises, and is tried again (`watch_lease`) until the key is
        gone or not ours, while our lease lives: a key bound to that lease would otherwise
        keep every replica from the job, and an error does not say the delete was not
        applied (the job is never taken for ours again: another may have claimed it)."""
        revision, lease = self._owned.pop(job, None), self._lease
        if revision is None:
            return
        if settle is not None:
            try:
                await settle()
            except Exception as exc:
                log.warning(
                    "job not settled before its release",
                    service=self.service,
                    job=job,
                    error=repr(exc),
                )
        key = self.keys.owner(self.service, job)
        try:
            await self.store.txn([Compare(key, "create", revision)], [Delete(key)])
        except Exception:
            if lease is not None and self._current(lease):
                self._releasing[job] = revision
            raise
        log.info("job released", service=self.service, job=job, replica=self.replica_id)

    async def _delete_released(self) -> None:
        """Delete again the keys of the jobs whose release failed (`_releasing`): done
        when deleted, or when the key is gone or another claim's; etcd away, next time."""
        for job, revision in list(self._releasing.items()):
            key = self.keys.owner(self.service, job)
            try:
                await self.store.txn([Compare(key, "create", revision)], [Delete(key)])
            except Exception as exc:
                log.info("released job's key not deleted yet", job=job, error=repr(exc))
                continue
            self._releasing.pop(job, None)
            log.info("job released", service=self.service, job=job, replica=self.replica_id)

    def _current(self, lease: Lease) -> bool:
        """`lease` is this replica's lease and has not lapsed (nor the replica stopped)."""
        return lease is self._lease and not lease.lost.is_set() and not self._stopped

    async def owner_of(self, job: str) -> str | None:
        got = await self.store.get(self.keys.owner(self.service, job))
        return decode_text(got.key, got.value) if got else None

    async def watch_lease(self) -> None:
        """Run as a task: drop every job the moment the lease lapses, then re-lease. etcd
        away, leasing is tried again (LEASE_RETRY), never raised: a replica with no
        lease owns nothing and claims nothing until it has one."""
        failures = 0
        while not self._stopped:
            try:
                lease = await self._ensure_lease()
            except Exception as exc:
                failures += 1
                if LEASE_RETRY.worth_reporting(failures):
                    log.warning("no lease; etcd away?", service=self.service, error=repr(exc))
                await asyncio.sleep(LEASE_RETRY.delay(failures))
                continue
            failures = 0
            while not lease.lost.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lease.lost.wait(), RELEASE_RETRY_S)
                if self._releasing and self._current(lease):
                    await self._delete_released()
            if not self._stopped:
                await self._drop_all("lease lost")

    async def _drop_all(self, why: str) -> None:
        self._releasing = {}  # the keys went with the lease
        jobs, self._owned = list(self._owned), {}
        for job in jobs:
            log.warning("job ownership dropped", service=self.service, job=job, why=why)
            for callback in self._lost_callbacks:
                with contextlib.suppress(Exception):
                    await callback(job)

    async def stop(self) -> None:
        """Revoke the lease (idempotent): other replicas can take our jobs at once."""
        self._stopped = True
        self._owned = {}
        if self._lease is not None:
            await self._lease.revoke()


async def claim_loop(
    ownership: Ownership, jobs: Callable[[], Awaitable[list[str]]], interval_s: float
) -> None:
    """Periodically try to claim every known job nobody owns (takeover after a crash)."""

    async def claim_known() -> None:
        for job in await jobs():
            if not ownership.owns(job):
                await ownership.try_acquire(job)

    await claim_rounds(claim_known, interval_s)


async def claim_rounds(claim_round: Callable[[], Awaitable[None]], interval_s: float) -> None:
    """Run as a task: `claim_round()` every `interval_s`; one that fails (etcd or NATS
    away) is logged and the next one comes as usual."""
    while True:
        try:
            await claim_round()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("claim round failed", error=str(exc))
        await asyncio.sleep(interval_s)
