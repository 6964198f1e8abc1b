"""Which jobs' step events a monitor replica receives: only those of the jobs it owns.

Step events are nearly all of a monitor's traffic (every rank, every step), so a replica
subscribes to `{p}.{job}.step.*` for each job it owns and to no other job's steps:
nats-server delivers each event to its job's owner alone, and replicas add ingest
capacity. (Hellos and exits, a few per rank per run, still reach every replica on
wildcard subscriptions: a hello is how a replica learns of a job starting.)

A claim subscribes first and takes the lease-bound owner key second, so a replica never
owns a job without receiving its steps, and "the owner key exists" means "its owner
receives the job's steps" (from the subscription's confirmation by nats-server on).
A claim that fails ends the subscription again. Events that come in while the claim is
under way wait for it (`claiming`).

Which replica claims a job is placement's choice (runtime/coordination/placement.py): the job's
preferred replica at once (on a rank's hello, or at the next claim round), any replica
once the job has gone unowned for a few rounds. The member list placement reads is
followed in etcd (`follow_members`). An owner hands a job back to its preferred replica
once that one has been up for a while (`to_hand_over`; the service lets the job go once
its incident transitions are stored, so the new owner carries its open ones on).
`reconcile` keeps the subscriptions equal to what the replica owns,
whatever took a job away (its lease lapsed, the job ended, a subscription that failed).

A job ended as abandoned (no rank heard from for `abandon_after_s`) is given up, but it
may only have been silent (a long evaluation): it stays *dormant*. Every replica keeps
receiving its steps without owning it, so that its next step makes it live again
(whichever replica claims it first; the others stop receiving it at their next claim
round). The dormant jobs are the ones etcd marks so (`jobs/{job}/abandoned`, read with
the claim round's scan), not a replica's memory: a job stays watched when the replica
that ended it dies or is redeployed while its ranks are silent. A dormant subscription
may hold DORMANT_BACKLOG_BYTES of steps (what comes while the job is being claimed), out
of the budget the owned jobs share."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable

import structlog

from antdt.runtime.bus import Bus, Delivery, Subscription
from antdt.runtime.coordination.ownership import Ownership
from antdt.runtime.coordination.placement import ClaimPlan
from antdt.runtime.recent import Recent
from antdt.runtime.shared import SharedCalls
from antdt.schemas import StepEvent, Subjects

log = structlog.get_logger("antdt.monitor")
#: Claim rounds a job may go unowned before a replica other than its preferred one
#: claims it: its preferred one is dead (its member key outlives it by up to the lease
#: TTL), full (`max_jobs`) or slow.
GRACE_ROUNDS = 2
#: Job ids (off the wire, in hellos) whose last claim try is remembered, at most.
MAX_PACED = 4096
#: Seconds before a job handed over and claimed back may be handed over again.
HAND_OVER_AGAIN_S = 600.0
#: Dormant jobs (ended as abandoned) whose steps a replica still receives, at most (the
#: longest dormant go first).
MAX_DORMANT = 1024
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
    ) -> None:
        """`backlog_bytes`: step events that may wait for the handler, every watched
        job's subscription together (each gets an equal share)."""
        self.bus = bus
        self.backlog_bytes = backlog_bytes
        self.subjects = subjects
        self.ownership = ownership
        self.on_step = on_step
        self.plan = ClaimPlan(ownership.replica_id, grace_s=GRACE_ROUNDS * round_s)
        self._subs: dict[str, Subscription] = {}
        # Subscribed, not owned; the most recently abandoned last.
        self._dormant: OrderedDict[str, None] = OrderedDict()
        self._kept: dict[str, float] = {}  # dormant jobs ended here -> when (monotonic s)
        self._round_s = round_s
        self._claims: SharedCalls[bool] = SharedCalls(failed=False)
        self._last_try: Recent[float] = Recent(MAX_PACED)  # job -> monotonic s
        self._members_known = False
        self._member_since: dict[str, float] = {}  # replica -> since when (monotonic s)
        self._handed: Recent[float] = Recent(MAX_PACED)  # job -> when handed over

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
            return owned
        finally:  # on an error too: not owned, and the subscription goes again
            if not owned:
                self.unwatch(job)

    async def claim_paced(self, job: str) -> bool:
        """`claim`, at most once a second per job (whatever the job id's messages ask)."""
        if self.ownership.owns(job) and job in self._subs:
            return True
        now = time.monotonic()
        last = self._last_try.get(job)
        if last is not None and now - last < 1.0:
            return False
        self._last_try.put(job, now)
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
        `hand_over`: that replica has been a member for a while, and `movable(job)`).
        A job handed over before and claimed back (its preferred replica did not take
        it: full at `max_jobs`, say) is not handed over again for HAND_OVER_AGAIN_S."""
        if not self._members_known:
            return None
        now = time.monotonic()

        def may_move(job: str) -> bool:
            last = self._handed.get(job)
            return (last is None or now - last >= HAND_OVER_AGAIN_S) and movable(job)

        job = self.plan.hand_over(self.ownership.jobs, self._member_since, now, may_move)
        if job is not None:
            self._handed.put(job, now)
        return job

    async def _members(self) -> list[str]:
        if not self._members_known:  # the follow has not read them yet
            return await self.ownership.replicas()
        return self.replicas

    async def claim_round(self, live: Iterable[str], dormant: Iterable[str] = ()) -> None:
        """Claim the live jobs placement gives this replica now (one read of the owners
        and one of the replicas, not a transaction per job); receive the steps of the
        `dormant` ones (most recently abandoned first), and of no other unowned job."""
        replicas = await self._members()
        owned = await self.ownership.owned_by_anyone()
        for job in self.plan.due(live, owned, replicas, time.monotonic()):
            await self.claim(job)
        self._hold_dormant(dormant, time.monotonic())
        await self.reconcile()

    def _hold_dormant(self, scanned: Iterable[str], now: float) -> None:
        """The dormant jobs are those etcd marks (`scanned`, most recent first), and those
        this replica ended since a round ago: the scan may have been read before."""
        recent = [job for job, at in self._kept.items() if now - at < self._round_s]
        self._kept = {job: self._kept[job] for job in recent}
        newest = [*dict.fromkeys([*recent, *scanned])][:MAX_DORMANT]
        self._dormant = OrderedDict((job, None) for job in reversed(newest))

    async def reconcile(self) -> None:
        """Subscriptions equal to what we own: a subscription for every owned or dormant
        job (one that failed is made again), none for a job no longer ours (claims under
        way keep theirs)."""
        try:
            for job in [*self.ownership.jobs, *self._dormant]:
                if job not in self._subs:
                    await self._watch(job, share=False)  # shared once, below
            for job in list(self._subs):
                mine = self.ownership.owns(job) or job in self._claims or job in self._dormant
                if not mine:
                    self.unwatch(job, share=False)  # shared once, below
        finally:  # NATS away midway too: what was subscribed keeps to its share
            self._share_backlog()  # a job may also have gone from dormant to owned or back

    async def keep_dormant(self, job: str) -> None:
        """Keep receiving the steps of `job`, ended as abandoned and given up: its next
        step (it was only silent) makes it live again. Bounded by MAX_DORMANT. NATS away:
        the next claim round subscribes."""
        self._dormant[job] = None
        self._dormant.move_to_end(job)
        self._kept[job] = time.monotonic()
        try:
            await self._watch(job)
        except Exception as exc:
            log.warning("dormant job's steps not subscribed yet", job=job, error=str(exc))
        while len(self._dormant) > MAX_DORMANT:
            oldest, _ = self._dormant.popitem(last=False)
            if not self.ownership.owns(oldest):
                self.unwatch(oldest)

    def wake(self, job: str) -> None:
        """`job` is live again (watched as an owned job from now on), or gone for good."""
        self._kept.pop(job, None)
        if job in self._dormant:
            del self._dormant[job]
            self._share_backlog()

    @property
    def dormant(self) -> list[str]:
        return list(self._dormant)

    def is_dormant(self, job: str) -> bool:
        return job in self._dormant

    def unwatch(self, job: str, *, share: bool = True) -> None:
        """Stop receiving the job's steps (what is queued still reaches the handler),
        unless it is dormant: then its steps are still wanted."""
        if job in self._dormant:
            return
        sub = self._subs.pop(job, None)
        if sub is not None:
            sub.end()
            if share:
                self._share_backlog()

    async def _watch(self, job: str, *, share: bool = True) -> None:
        if job not in self._subs:
            self._subs[job] = await self.bus.subscribe(
                self.subjects.step(job, "*"), StepEvent, self.on_step
            )
            if share:
                self._share_backlog()

    def _share_backlog(self) -> None:
        """Each watched job's subscription may hold an equal share of `backlog_bytes`
        (a dormant job's: DORMANT_BACKLOG_BYTES, out of the budget). A cap per
        subscription alone would let a replica far behind hold that much per job it
        owns, out of memory with many jobs where one subscription for every job dropped
        events; shared, the replica holds at most the budget and drops the rest
        (counted), whatever the number of jobs."""
        dormant = {job for job in self._subs if self._only_dormant(job)}
        share = self.backlog_bytes // max(1, len(self._subs) - len(dormant))
        for job, sub in self._subs.items():
            sub.limit_pending(DORMANT_BACKLOG_BYTES if job in dormant else share)

    def _only_dormant(self, job: str) -> bool:
        return job in self._dormant and not self.ownership.owns(job) and job not in self._claims
