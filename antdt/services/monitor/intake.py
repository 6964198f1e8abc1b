"""Which jobs' step events a monitor replica receives: those of the jobs it owns, and of
the dormant ones. A claim subscribes first and takes the owner key second, so "the owner
key exists" means "its owner receives the job's steps". docs/architecture.md (the
monitor, replicas share the ingest) says why, and how jobs are placed and handed over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

import structlog

from antdt.runtime.bus import Bus, Delivery, Subscription
from antdt.runtime.coordination.ownership import Ownership
from antdt.runtime.coordination.placement import ClaimPlan
from antdt.runtime.shared import SharedCalls
from antdt.schemas import StepEvent, Subjects
from antdt.services.monitor import lifecycle
from antdt.services.monitor.lifecycle import JobBook, JobPhase

log = structlog.get_logger("antdt.monitor")
#: Claim rounds a job may go unowned before a replica other than its preferred one
#: claims it: its preferred one is dead (its member key outlives it by up to the lease
#: TTL), full (`max_jobs`) or slow.
GRACE_ROUNDS = 2
#: Bytes of step events a dormant job's subscription may hold (those that come while the
#: job is claimed again): at MAX_DORMANT jobs, 64 MiB beside the owned jobs' budget.
DORMANT_BACKLOG_BYTES = 64 * 1024

StepHandler = Callable[[StepEvent, Delivery], Awaitable[None]]


class JobIntake:
    """The owned jobs' step subscriptions of one monitor replica, and its claims."""

    def __init__(
        self,
        bus: Bus,
        subjects: Subjects,
        ownership: Ownership,
        on_step: StepHandler,
        *,
        round_s: float,
        backlog_bytes: int,
        book: JobBook | None = None,
    ) -> None:
        """`backlog_bytes`: step events that may wait for the handler, every watched
        job's subscription together (each gets an equal share). `book`: the replica's
        job records, where claims and dormant jobs are recorded."""
        self.bus = bus
        self.book = book if book is not None else JobBook()
        self.backlog_bytes = backlog_bytes
        self.subjects = subjects
        self.ownership = ownership
        self.on_step = on_step
        self.plan = ClaimPlan(ownership.replica_id, grace_s=GRACE_ROUNDS * round_s)
        self._subs: dict[str, Subscription] = {}
        self._round_s = round_s
        self._claims: SharedCalls[bool] = SharedCalls(failed=False)
        self._members_known = False
        self._member_since: dict[str, float] = {}  # replica -> since when (monotonic s)

    @property
    def watched(self) -> list[str]:
        """Jobs whose steps this replica subscribes to, sorted."""
        return sorted(self._subs)

    @property
    def backlog(self) -> tuple[int, int]:
        """Step events waiting for the handler, every watched job's: (how many, bytes)."""
        waiting = [sub.pending for sub in self._subs.values()]
        return sum(n for n, _ in waiting), sum(b for _, b in waiting)

    @property
    def replicas(self) -> list[str]:
        """The service's replicas as this one last heard (`follow_members`)."""
        return sorted(self._member_since)

    def claiming(self, job: str) -> asyncio.Future[bool] | None:
        """The claim of `job` under way, if any: its result says whether it is ours."""
        return self._claims.under_way(job)

    async def claim(self, job: str) -> bool:
        """Subscribe to the job's steps, then claim it; True if we own it. One claim per
        job at a time: callers meanwhile share its answer."""
        if self.ownership.owns(job) and job in self._subs:
            return True
        return await self._claims.run(job, lambda: self._subscribe_and_claim(job))

    async def _subscribe_and_claim(self, job: str) -> bool:
        owned = False
        try:
            await self._watch(job)
            owned = await self.ownership.try_acquire(job)
            if owned:
                lifecycle.claimed(self.book, job, time.monotonic())
            return owned
        finally:  # on an error too: not owned, and the subscription goes again
            if not owned:
                self.unwatch(job)

    async def claim_paced(self, job: str) -> bool:
        """`claim`, at most once a second per job (whatever the job id's messages ask)."""
        if self.ownership.owns(job) and job in self._subs:
            return True
        if not lifecycle.may_claim(self.book, job, time.monotonic()):
            return False
        try:
            return await self.claim(job)
        except Exception as exc:
            log.info("claim failed", job=job, error=str(exc))
            return False

    async def prefers(self, job: str) -> bool:
        """Is this replica the one to claim `job` at first sight (a rank's hello)? By the
        member list `follow_members` keeps (read now if it has not come yet)."""
        return self.plan.mine_first(job, await self._members())

    async def follow_members(self) -> None:
        """Run as a task: the service's member list kept equal to etcd's, so that a
        replica joining or leaving changes placement at once, not a claim round later."""
        prefix = self.ownership.keys.members(self.ownership.service)
        async for event in self.ownership.store.follow_prefix(prefix):
            name = event.key[len(prefix) :]
            if event.kind == "put":
                self._member_since.setdefault(name, time.monotonic())
            else:
                self._member_since.pop(name, None)
            self._members_known = True

    def to_hand_over(self, movable: Callable[[str], bool]) -> str | None:
        """One owned job to give to its preferred replica, if any (placement's
        `hand_over`: that replica has been a member for a while, and `movable(job)`),
        not one handed over and claimed back lately (`lifecycle.may_hand_over`)."""
        if not self._members_known:
            return None
        now = time.monotonic()

        def may_move(job: str) -> bool:
            return lifecycle.may_hand_over(self.book, job, now) and movable(job)

        job = self.plan.hand_over(self.ownership.jobs, self._member_since, now, may_move)
        if job is not None:
            lifecycle.handed_over(self.book, job, now)
        return job

    async def _members(self) -> list[str]:
        if not self._members_known:  # the follow has not read them yet
            return await self.ownership.replicas()
        return self.replicas

    async def claim_round(self, live: Iterable[str], dormant: Sequence[str] = ()) -> None:
        """Claim the live jobs placement gives this replica now (one read of the owners
        and one of the replicas, not a transaction per job); receive the steps of the
        `dormant` ones (most recently abandoned first), and of no other unowned job."""
        replicas = await self._members()
        owned = await self.ownership.owned_by_anyone()
        for job in self.plan.due(live, owned, replicas, time.monotonic()):
            await self.claim(job)
        lifecycle.hold_dormant(self.book, dormant, time.monotonic(), self._round_s)
        await self.reconcile()

    async def reconcile(self) -> None:
        """Subscriptions equal to what we own: a subscription for every owned or dormant
        job (one that failed is made again), none for a job no longer ours (claims under
        way keep theirs)."""
        try:
            for job in [*self.ownership.jobs, *self.dormant]:
                if job not in self._subs:
                    await self._watch(job, share=False)  # shared once, below
            for job in list(self._subs):
                mine = self.ownership.owns(job) or job in self._claims or self.is_dormant(job)
                if not mine:
                    self.unwatch(job, share=False)  # shared once, below
        finally:  # NATS away midway too: what was subscribed keeps to its share
            self._share_backlog()  # a job may also have gone from dormant to owned or back

    async def keep_dormant(self, job: str) -> None:
        """Keep receiving the steps of `job`, ended as abandoned and given up: its next
        step (it was only silent) makes it live again. Bounded by MAX_DORMANT. NATS away:
        the next claim round subscribes."""
        now = time.monotonic()
        lifecycle.dormant(self.book, job, now)
        try:
            await self._watch(job)
        except Exception as exc:
            log.warning("dormant job's steps not subscribed yet", job=job, error=str(exc))
        for oldest in lifecycle.too_many_dormant(self.book, now):
            if not self.ownership.owns(oldest):
                self.unwatch(oldest)

    def wake(self, job: str) -> None:
        """`job` is live again (watched as an owned job from now on), or gone for good."""
        lifecycle.woken(self.book, job, time.monotonic())
        self._share_backlog()

    @property
    def dormant(self) -> list[str]:
        """The dormant jobs, the longest dormant first."""
        return self.book.jobs(JobPhase.DORMANT)

    def is_dormant(self, job: str) -> bool:
        return self.book.phase(job) is JobPhase.DORMANT

    def unwatch(self, job: str, *, share: bool = True) -> None:
        """Stop receiving the job's steps (what is queued still reaches the handler),
        unless it is dormant: then its steps are still wanted."""
        if self.is_dormant(job):
            return
        sub = self._subs.pop(job, None)
        if sub is not None:
            sub.end()
            if share:
                self._share_backlog()

    async def _watch(self, job: str, *, share: bool = True) -> None:
        """Subscribe to the job's steps unless subscribed: one subscription per job, also
        when two callers (a claim round, a hello's claim) watch it at once."""
        if job in self._subs:
            return
        sub = await self.bus.subscribe(self.subjects.step(job, "*"), StepEvent, self.on_step)
        if job in self._subs:  # another caller subscribed while this one waited
            sub.end()
            return
        self._subs[job] = sub
        if share:
            self._share_backlog()

    def _share_backlog(self) -> None:
        """Each watched job's subscription may hold an equal share of `backlog_bytes`
        (a dormant job's: DORMANT_BACKLOG_BYTES, out of the budget), so that a replica
        far behind holds at most the budget, whatever the number of its jobs."""
        dormant = {job for job in self._subs if self._only_dormant(job)}
        share = self.backlog_bytes // max(1, len(self._subs) - len(dormant))
        for job, sub in self._subs.items():
            sub.limit_pending(DORMANT_BACKLOG_BYTES if job in dormant else share)

    def _only_dormant(self, job: str) -> bool:
        owned = self.ownership.owns(job) or job in self._claims
        return not owned and self.is_dormant(job)
