"""The shard stream's state machine: what to ask the shards service next, and what its
replies mean for this rank. Pure: no I/O, no clock, no locks (the shell adds those).
Epochs only move forward on a rank (docs/architecture.md, the agent's shard stream)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from antdt.agent.readahead import ReadAhead, shard_key
from antdt.agent.sampling import Cursor, LocalShards, Taken
from antdt.agent.unconfirmed import Unconfirmed
from antdt.schemas import (
    ErrorCode,
    FetchStatus,
    ShardCommit,
    ShardFetch,
    ShardGrant,
    ShardPosition,
    ShardRef,
    ShardRelease,
    ShardReply,
)

#: Most done refs one ShardFetch may carry, most grants one may ask for, and most held
#: refs it may list (the schema's). A rank lists every grant it holds: one left out looks
#: lacking to the service, which re-sends it instead of a new one.
MAX_DONE = 64
MAX_WANT = 8
MAX_HELD = 1024
#: Floor of every retry delay, seconds: a service answering "retry after 0" must not make
#: the rank spin.
MIN_RETRY_S = 0.05
#: Refusals that no retry can fix: this process is not a member of the job's present.
FATAL_CODES = frozenset({ErrorCode.INCARNATION, ErrorCode.REMOVED})


class Settled(Enum):
    """How the ledger answered a group out of data in an epoch (`StreamState.settle`):
    FINISHED, every shard of it is done (the group leaves it); REOPENED, shards came back
    to be granted (a removed rank's), and the group takes them up before leaving."""

    FINISHED = "finished"
    REOPENED = "reopened"


#: How a rank's answer to a settle counts when its group agrees on them (the MAX over the
#: group): any REOPENED takes every rank back into the epoch; else any "wait" (None:
#: shards still in flight) makes every rank ask again; else all of them leave it.
SETTLE_WAIT = 1
SETTLE_CODES: dict[Settled | None, int] = {
    Settled.FINISHED: 0,
    None: SETTLE_WAIT,
    Settled.REOPENED: 2,
}


@dataclass
class StreamState:
    job: str
    rank: int
    seed: int
    prefetch: int
    shard_size: int
    global_batch: int = 0  # samples per step of the whole job (0: unknown)
    say_share: bool = True  # False once a service too old for the batch fields refused them
    can_settle: bool = True  # False once a service too old for settle requests refused one
    epoch: int = 0
    incarnation: int = 0  # set by a restore; fences this process from older ones
    established: bool = False  # a reply confirmed `epoch` (OK or EPOCH_DONE)
    exhausted: bool = False  # the service has no more shards of `epoch` to grant
    job_done: bool = False
    fatal: str | None = None  # the service will never serve this process again: why
    local: LocalShards = field(init=False)
    pending_done: list[ShardRef] = field(default_factory=list)
    sending: list[ShardRef] = field(default_factory=list)
    # Reported, accepted, not yet durable (the reply listed them): reported again.
    unconfirmed: Unconfirmed = field(default_factory=Unconfirmed)
    sending_at: float = -math.inf  # when the request in flight (`sending`) was built
    unsynced: set[ShardRef] = field(default_factory=set)  # taken to the end, step not synced
    demand: int = 0  # samples a blocked take still lacks
    batch_hint: int = 0  # the last batch asked for: what the next take will want
    dropped_grants: int = 0
    seen: set[ShardRef] = field(default_factory=set)  # every grant taken, for replays
    settling: int | None = None  # the epoch this rank's group ran out of data in
    settled: Settled | None = None  # the ledger's answer to `settling`, once it is final
    settle_waits: int = 0  # answers to `settling` that said "wait" (none final yet)
    ahead: ReadAhead = field(default_factory=ReadAhead)  # taken by a DataLoader, not trained

    def __post_init__(self) -> None:
        self.local = LocalShards(seed=self.seed)

    # -- requests ---------------------------------------------------------------------

    def want(self) -> int:
        """How many new grants to ask for now."""
        if self.job_done or self.exhausted:
            return 0
        if not self.established:
            return self.prefetch
        want = self.prefetch - len(self.local)
        short = self.demand + self.batch_hint - self.local.remaining
        if short > 0:
            want = max(want, math.ceil(short / self.shard_size))
        return max(0, min(want, MAX_WANT))

    def needs_fetch(self) -> bool:
        if self.job_done or self.fatal is not None:
            return False
        if self.settling is not None:
            return self.settled is None
        return bool(self.pending_done) or (self.want() > 0 and not self._done_is_near())

    def _settle_due(self) -> bool:
        return self.settling is not None and self.settled is None

    def _done_is_near(self) -> bool:
        """Hold the request for the next grant until the step that finished a shard is
        synced, so "done with X" and "give me the next" go in one request, while what
        this rank holds lasts two more takes (the second covers a slow reply)."""
        return (
            self.established
            and bool(self.unsynced)
            and self.demand == 0
            and self.local.remaining >= 2 * self.batch_hint
        )

    def next_fetch(self, confirm: bool = False, now: float | None = None) -> ShardFetch | None:
        """The next request, or None when there is nothing to ask or report (`confirm`:
        also to have every unconfirmed done ref confirmed). Done refs it carries move to
        `sending` until `on_reply` or `on_failure`. `now` (monotonic seconds) decides which
        unconfirmed refs are due again; None: all are."""
        settle = self._settle_due()
        if self.settling is not None and not settle:
            # Settled, the group not yet agreed: nothing goes out until it has (every
            # done ref went with the settle), so the answer the others are still asking
            # for stays the one this rank got.
            return None
        if not (self.needs_fetch() or (confirm and self.unconfirmed and not self.job_done)):
            return None
        report = self.unconfirmed.due(now, everything=confirm or settle) + self.pending_done
        self.sending, self.pending_done = report[:MAX_DONE], report[MAX_DONE:]
        self.sending_at = -math.inf if now is None else now
        # The batch of the latest take is this rank's share of the job's consumption,
        # which bounds what the service reserves for it.
        share = self.say_share and 0 < self.batch_hint <= self.global_batch
        return ShardFetch(
            job=self.job,
            rank=self.rank,
            epoch=self.epoch,
            done=tuple(self.sending),
            want=0 if settle else self.want(),
            incarnation=self.incarnation,
            held=self.held(self.pending_done if settle else ()),
            local_batch=self.batch_hint if share else None,
            global_batch=self.global_batch if share else None,
            settle=settle,
        )

    def held(self, unsent: Sequence[ShardRef] = ()) -> tuple[ShardRef, ...]:
        """Every grant this rank holds and has not reported done, so the service hands
        out only what it lacks (`unsent`: finished ones this request does not report)."""
        held = [c.grant.ref() for c in self.local.cursors]
        unsynced = sorted(self.unsynced, key=lambda r: (r.epoch, r.shard))
        return tuple(held + unsynced + list(unsent))[:MAX_HELD]

    def on_refused(self, code: ErrorCode, reason: str) -> None:
        """A refusal: final for a process of another incarnation or a removed rank."""
        if code in FATAL_CODES:
            self.fatal = f"{code}: {reason}"
        elif code == ErrorCode.BAD_REQUEST and (
            "local_batch" in reason or "global_batch" in reason
        ):
            # A shards service of an earlier version, which knows no batch share: ask as
            # before (an even share is reserved for this rank).
            self.say_share = False
        elif code == ErrorCode.BAD_REQUEST and "settle" in reason and self._settle_due():
            # An earlier version, which knows no settle request: leave the epoch on the
            # step's zero alone, as the group did before (a late hand-back is stranded).
            self.can_settle, self.settled = False, Settled.FINISHED
        self.on_failure()

    def on_failure(self) -> None:
        """The request was not answered: its done refs go out again with the next one (the
        service must treat a repeated done as a no-op)."""
        self.pending_done = self.sending + self.pending_done
        self.sending = []

    # -- replies ------------------------------------------------------------------------

    def on_reply(self, fetch: ShardFetch, reply: ShardReply, cursors: list[Cursor]) -> float:
        """Apply a reply; `cursors` are its grants opened (ordered) by the shell outside
        the lock. Returns seconds to wait before the next request (0: go on)."""
        self.unconfirmed.answered(reply.unconfirmed, self.sending_at)
        self.sending = []
        if reply.status is FetchStatus.JOB_DONE:
            self.job_done = True
            self.local = LocalShards(seed=self.seed)
            if self._settle_due():  # whatever the request: a settle under way is answered
                self.settled = Settled.FINISHED
            return 0.0
        if fetch.settle:
            return self._on_settle_reply(fetch, reply, cursors)
        # A done report in flight when the group ran out may be the reply that says the
        # ledger moved on: then the settle is answered, and no settle request goes out.
        self._settled_by_the_ledger_moving_on(reply.epoch)
        if reply.epoch > self.epoch:
            self.dropped_grants += len(self.local.drop_before(reply.epoch))
            self.epoch, self.established, self.exhausted = reply.epoch, False, False
        added = self._hold(cursors)
        if reply.epoch > fetch.epoch and reply.status is FetchStatus.EPOCH_DONE:
            # "Done" answered the epoch asked for, not the ledger's: ask again in it.
            return 0.0
        if reply.epoch < self.epoch or reply.status is FetchStatus.PENDING:
            # The ledger has not reached the epoch this rank asked for.
            return max(reply.retry_after_s, MIN_RETRY_S)
        self.established = True
        if reply.status is FetchStatus.EPOCH_DONE:
            self.exhausted = True
        elif not added and fetch.want > 0:
            return max(reply.retry_after_s, MIN_RETRY_S)  # OK but nothing new: do not spin
        return 0.0

    def _settled_by_the_ledger_moving_on(self, ledger_epoch: int) -> None:
        if self.settled is None and self.settling is not None and ledger_epoch > self.settling:
            self.settled = Settled.FINISHED

    def _on_settle_reply(
        self, fetch: ShardFetch, reply: ShardReply, cursors: list[Cursor]
    ) -> float:
        """The ledger's answer to a settle (it grants nothing new): final once every done
        ref is out and no shard of the epoch is in flight, or once it hands this rank
        shards it did not know it held (REOPENED); else asked again (`settle_waits`)."""
        # Shards the ledger says this rank holds and it never heard of (the reply to the
        # request that granted them went nowhere): its group must train them.
        strays = self._hold(cursors) if reply.epoch == fetch.epoch else 0
        if reply.epoch > fetch.epoch:
            self.settled = Settled.FINISHED  # the ledger left it: it was finished
        elif strays:
            self.settled = Settled.REOPENED
        elif self.pending_done:
            return 0.0  # more done refs than one request carries: report the rest first
        elif reply.epoch < fetch.epoch or reply.outstanding is None or reply.outstanding:
            self.settle_waits += 1
            return max(reply.retry_after_s, MIN_RETRY_S)  # held elsewhere: wait
        elif reply.status is FetchStatus.OK:
            self.settled = Settled.REOPENED
        else:
            self.settled = Settled.FINISHED
        return 0.0

    def _hold(self, cursors: list[Cursor]) -> int:
        """Take the new grants; a grant seen before (same epoch, shard and attempt: a
        replayed reply) is ignored, so no sample is served twice. Returns how many."""
        added = 0
        for cursor in cursors:
            grant = cursor.grant
            ref = grant.ref()
            if ref in self.seen or grant.epoch > self.epoch:
                self.dropped_grants += 1  # replayed, or from the future: never serve it
                continue
            self.seen.add(ref)
            if cursor.remaining == 0:
                self.pending_done.append(ref)  # restored at its end: only report it
            elif self.local.add_cursor(cursor):
                added += 1
        return added

    # -- the training thread's side -------------------------------------------------

    def take(self, n: int, epoch: int, into: Taken) -> bool:
        """Move up to n - len(into.ids) ids into `into`. True when the take is complete:
        it has n ids, or this rank gets no more data in `epoch`."""
        self.batch_hint = n
        finished = len(into.finished)
        self.local.take(n - len(into.ids), epoch, into)
        self.unsynced.update(into.finished[finished:])
        if len(into.ids) < n and self._should_recheck(epoch, into):
            into.rechecked, self.exhausted = True, False  # the fetcher asks once more
        done = len(into.ids) >= n or self.epoch_over(epoch)
        self.demand = 0 if done else n - len(into.ids)
        return done

    def _should_recheck(self, epoch: int, into: Taken) -> bool:
        """An exhausted rank out of data asks once more per step before calling its epoch
        over: a removed rank's shards may have been re-queued since the last answer."""
        return (
            self.exhausted
            and not into.rechecked
            and not self.job_done
            and epoch == self.epoch
            and self.local.available(epoch) == 0
        )

    def holds(self, epoch: int) -> bool:
        """Samples of `epoch` (or before) this rank holds and no step has taken yet: in
        its grants, or read ahead by a DataLoader and not delivered. The ledger counts
        their shards in flight until they are trained."""
        return self.local.available(epoch) > 0 or self.ahead.waiting()

    def epoch_over(self, epoch: int) -> bool:
        """No more samples for this rank in `epoch`: job done, jumped past it, or the
        service has none left and the local grants of that epoch are used up."""
        if self.local.available(epoch) > 0:
            return False
        return self.job_done or self.epoch > epoch or self.exhausted

    def synced(self, refs: list[ShardRef]) -> None:
        """The step that consumed these shards' last samples has updated the model."""
        self.unsynced.difference_update(refs)
        self.pending_done.extend(refs)

    def advance(self, finished_epoch: int) -> None:
        """The training loop finished `finished_epoch`: ask for the next one."""
        if self.epoch <= finished_epoch:
            self.epoch, self.established, self.exhausted = finished_epoch + 1, False, False
            # Older epochs' grants cannot come back (the ledger has moved on): forget them.
            self.seen = {ref for ref in self.seen if ref.epoch >= finished_epoch}

    def settle(self, epoch: int) -> None:
        """The group of this rank ran out of data in `epoch` (a step's all-reduced count was
        zero): ask the ledger whether the epoch is over (`settled`). A rank that already
        moved past it, or whose job is done, knows without asking (and one whose service
        is too old to be asked takes the zero for the answer)."""
        self.settling, self.settle_waits = epoch, 0
        known = self.job_done or self.epoch > epoch or not self.can_settle
        self.settled = Settled.FINISHED if known else None

    def end_settle(self, reopen: bool) -> None:
        """The group agreed on the settle's outcome; `reopen`: it takes up the shards
        that came back, so this rank asks for grants in the epoch again."""
        if reopen and self.settling == self.epoch:
            self.exhausted = False
        self.settling = self.settled = None

    def ready(self, epoch: int) -> bool:
        """begin_epoch(epoch) may return: the job is done, or epoch >= `epoch` is confirmed."""
        return self.job_done or (self.established and self.epoch >= epoch)

    def unreported(self) -> int:
        """Done refs not yet known durable by the service."""
        return len(self.pending_done) + len(self.sending) + len(self.unconfirmed)

    # -- checkpoints and removal -------------------------------------------------------

    def unacknowledged(self) -> tuple[ShardRef, ...]:
        """Finished shards the service may not know of yet (a repeat is harmless)."""
        return tuple(dict.fromkeys(self.sending + self.unconfirmed.refs() + self.pending_done))

    def positions(self) -> tuple[ShardPosition, ...]:
        """How far the model got in every shard held; call between steps. Ids read ahead
        (a DataLoader's, not yet trained on) do not count: a restore hands them out again."""
        behind = self.ahead.behind()
        at = {shard_key(c.grant): (c.grant, c.position) for c in self.local.cursors}
        for key, (grant, count) in behind.items():  # a grant read ahead to its end included
            end = at[key][1] if key in at else grant.size
            at[key] = (grant, end - count)
        return tuple(
            ShardPosition(
                epoch=grant.epoch, shard=grant.shard, attempt=grant.attempt, position=position
            )
            for grant, position in at.values()
            if grant.epoch == self.epoch
        )

    def commit_request(self, step: int) -> ShardCommit:
        return ShardCommit(
            job=self.job,
            rank=self.rank,
            incarnation=self.incarnation,
            step=step,
            epoch=self.epoch,
            done=self.unacknowledged(),
            positions=self.positions(),
        )

    def release_request(self, reason: str) -> ShardRelease:
        return ShardRelease(
            job=self.job,
            rank=self.rank,
            incarnation=self.incarnation,
            done=self.unacknowledged(),
            positions=self.positions(),
            reason=reason,
        )


def open_cursors(grants: tuple[ShardGrant, ...], seed: int) -> list[Cursor]:
    return [Cursor.open(g, seed) for g in grants]
