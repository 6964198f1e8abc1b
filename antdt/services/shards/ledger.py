"""The shard ledger's fetch path: done-and-fetch as one pure step (the state in state.py,
checkpoints in checkpoints.py). A request is judged as a whole: any error leaves the
ledger untouched, so a client may always retry the same request."""

from __future__ import annotations

from typing import NamedTuple

from antdt.schemas import ErrorCode, ErrorReply, FetchStatus, ShardFetch, ShardRef, ShardReply
from antdt.services.shards.early import Early
from antdt.services.shards.inflight import InFlightTable
from antdt.services.shards.state import (
    InFlightEntry,
    LedgerState,
    Requeued,
    finished,
    new_ledger,
    shard_range,
    status,
)
from antdt.services.shards.work import Work, error

__all__ = [
    "InFlightEntry",
    "LedgerState",
    "Requeued",
    "Work",
    "apply_fetch",
    "epoch_end_to_announce",
    "error",
    "new_ledger",
    "pending_retry_s",
    "plan_fetch",
    "release_rank",
    "shard_range",
    "status",
]

#: Most shards reserved ahead across all ranks of a job: reservations are DOING entries
#: of the stored ledger, which must stay compact (one etcd value, written every few ms).
#: A job with more ranks than this reserves nothing: its many ranks fill every write anyway.
MAX_RESERVED = 256
#: How long a rank asking for the next epoch too early waits before asking again, at
#: least: a fallback to the epoch's announcement (EpochFinished), growing with the job's
#: ranks so that a large job's waiting ranks do not outask what a replica serves.
PENDING_RETRY_S = 0.05
#: Polls a second, at most, that the waiting ranks of one job make together.
PENDING_POLLS_PER_S = 200.0
#: The longest a waiting rank goes between polls, seconds (if it missed the announcement).
PENDING_RETRY_MAX_S = 5.0


def pending_retry_s(state: LedgerState) -> float:
    """Seconds a rank waiting at an epoch's end (its settle answered with shards still in
    flight, or the next epoch asked for too early) waits before asking again:
    PENDING_RETRY_S, or as long as keeps the job's active ranks, all waiting, to
    PENDING_POLLS_PER_S together, up to PENDING_RETRY_MAX_S."""
    polls = max(1, state.active_count) / PENDING_POLLS_PER_S
    return min(PENDING_RETRY_MAX_S, max(PENDING_RETRY_S, polls))


def epoch_end_to_announce(state: LedgerState) -> int | None:
    """The epoch whose end the job's ranks should be told of (EpochFinished), judged on the
    ledger after an operation; None: none. The ledger's own epoch once it is finished (the
    last one too); else the previous one while nothing of this one is done yet, because the
    replica that finished it may have died before telling the waiting ranks."""
    if finished(state):
        return state.epoch
    if state.epoch >= 1 and state.done_count == 0:
        return state.epoch - 1
    return None


def release_rank(state: LedgerState, rank: int) -> LedgerState:
    """Hand a removed rank's in-flight shards back, to be granted again from their
    recorded position (with a new attempt, so the old holder is fenced). A pending
    checkpoint is dropped: the rank's commit to it no longer describes the job."""
    edit = InFlightTable.of(state.in_flight).edit()
    mine = [edit[shard] for shard in edit.shards_of(rank)]
    if not mine and state.pending is None:
        return state
    back = tuple(Requeued(shard=e.shard, position=e.position, attempt=e.attempt) for e in mine)
    for entry in mine:
        del edit[entry.shard]
    return state.model_copy(
        update={
            "in_flight": edit.build(),
            "requeued": state.requeued + back,
            "pending": None,
        }
    )


def apply_fetch(state: LedgerState, req: ShardFetch) -> tuple[LedgerState, ShardReply | ErrorReply]:
    """`plan_fetch` without reservations, as a (state, reply) pair."""
    result = plan_fetch(state, req)
    return result.state, result.reply


class FetchResult(NamedTuple):
    """A fetch's outcome. `early`: the reply may go out before this change is durable,
    if what it delivers is already durable (see Early); `reserved`: grants made ahead
    for the rank and not yet delivered, which should become durable soon."""

    state: LedgerState
    reply: ShardReply | ErrorReply
    early: Early | None = None
    reserved: int = 0


def plan_fetch(state: LedgerState, req: ShardFetch, reserve: int = 0) -> FetchResult:
    """Account the request's done shards, then deliver up to `want` grants. The ledger's epoch
    gets grants (EPOCH_DONE once none is left), the next one PENDING until the current is
    complete (JOB_DONE after the last), an earlier one EPOCH_DONE, a later one `stale`. With
    `held`, up to `reserve` shards may be granted ahead (`_deliver`); without it, the reply
    re-sends every grant the rank holds."""
    work = Work.of(state)
    error = _check_request(state, req) or _apply_done(work, state, req)
    if error is not None:
        return FetchResult(state, error)
    if req.epoch < state.epoch:
        return FetchResult(work.state(), work.reply(FetchStatus.EPOCH_DONE))
    if req.settle:
        return _settle(work, state, req)
    if req.epoch == state.epoch + 1:
        if not work.finished():
            pending = work.reply(FetchStatus.PENDING, retry=pending_retry_s(state))
            return FetchResult(work.state(), pending)
        if state.epoch + 1 >= state.epochs:
            work.complete = True
            return FetchResult(work.state(), work.reply(FetchStatus.JOB_DONE))
        work.next_epoch()
    if work.complete:
        return FetchResult(work.state(), work.reply(FetchStatus.JOB_DONE))
    if req.held is None:
        return _grant(work, req)
    return _deliver(work, req, reserve)


# ------------------------------------------------------------------- internals


_error = error


def check_member(state: LedgerState, job: str, rank: int, incarnation: int) -> ErrorReply | None:
    """Is this request from a current rank of this job? Every ledger request asks."""
    if job != state.job:
        return error(ErrorCode.BAD_REQUEST, f"request for job {job!r} sent to {state.job!r}")
    if rank >= state.world_size:
        return error(ErrorCode.BAD_REQUEST, f"rank {rank} outside world size {state.world_size}")
    if incarnation != state.incarnation:
        return error(
            ErrorCode.INCARNATION,
            f"this process belongs to incarnation {incarnation} of job {job}, the ledger to "
            f"incarnation {state.incarnation}: a restarted job must restore (agent.restore) "
            "before training, and processes of an older incarnation must stop",
        )
    if rank in state.left:
        return error(ErrorCode.REMOVED, f"rank {rank} was removed from the job")
    return None


def check_refs(state: LedgerState, refs: tuple[ShardRef, ...]) -> ErrorReply | None:
    for ref in refs:
        if ref.shard >= state.num_shards:
            return error(
                ErrorCode.BAD_REQUEST, f"shard {ref.shard} outside [0, {state.num_shards})"
            )
    return None


def _check_request(state: LedgerState, req: ShardFetch) -> ErrorReply | None:
    member = check_member(state, req.job, req.rank, req.incarnation)
    if member is not None:
        return member
    if req.epoch > state.epoch + 1:
        return _error(ErrorCode.STALE, f"epoch {req.epoch} is ahead of the ledger's {state.epoch}")
    return check_refs(state, req.done)


def _apply_done(work: Work, state: LedgerState, req: ShardFetch) -> ErrorReply | None:
    return apply_done(work, state, req.rank, req.done)


def apply_done(
    work: Work, state: LedgerState, rank: int, refs: tuple[ShardRef, ...]
) -> ErrorReply | None:
    """Mark `rank`'s done refs on `work`; the first bad one aborts the request."""
    for ref in refs:
        if ref.epoch == state.epoch:
            refused = work.done(ref, rank)
            if refused is not None:
                return refused
        elif ref.epoch > state.epoch:
            return _error(
                ErrorCode.STALE, f"done for epoch {ref.epoch}; the ledger is at {state.epoch}"
            )
        # Every earlier epoch was complete before the ledger advanced: a late or repeated
        # done for one (a reconfirmation after two short epochs) is an idempotent no-op.
    return None


#: Most shards a settle reply hands back to the asking rank (see _settle); once its group
#: goes on in the epoch, its fetches deliver the rest.
SETTLE_DELIVERS = 8


def _settle(work: Work, state: LedgerState, req: ShardFetch) -> FetchResult:
    """A group out of data asks whether it may leave the epoch: how many of its shards are in
    flight (`outstanding`) and whether any is left to grant (OK). Grants and reserves nothing
    and changes only the done refs, so a settle applied late cannot undo what came after it.
    Shards in flight for the rank that `held` does not list come back (OK), to be trained:
    otherwise the whole group would wait for them for good."""
    if req.epoch != state.epoch:
        return FetchResult(
            state,
            _error(
                ErrorCode.STALE, f"settle for epoch {req.epoch}, which the ledger has not started"
            ),
        )
    if work.complete:
        return FetchResult(work.state(), work.reply(FetchStatus.JOB_DONE))
    outstanding = len(work.in_flight)
    strays: list[InFlightEntry] = []
    if req.held is not None and outstanding:
        _, strays = _lacking(work, req.rank, req.held, SETTLE_DELIVERS)
    grants = [work.grant_of(e) for e in strays]
    retry = pending_retry_s(state) if outstanding else 0.0
    status = FetchStatus.OK if grants or work.grantable() else FetchStatus.EPOCH_DONE
    reply = work.reply(status, grants, retry=retry, outstanding=outstanding)
    return FetchResult(work.state(), reply)


def _grant(work: Work, req: ShardFetch) -> FetchResult:
    # Every reply re-sends what the rank already holds: a reply lost in flight (timeout,
    # NATS restart) must not strand its shards in DOING. Agents ignore grants seen before.
    # The status speaks of new work only: EPOCH_DONE still means "nothing new to grant".
    held = work.held_by(req.rank)
    fresh = [work.grant_of(work.grant(req.rank)) for _ in range(req.want) if work.grantable()]
    status = FetchStatus.OK if fresh or work.grantable() else FetchStatus.EPOCH_DONE
    return FetchResult(work.state(), work.reply(status, held + fresh))


def _deliver(work: Work, req: ShardFetch, reserve: int) -> FetchResult:
    """Deliver what the rank lacks: first the shards granted to it that it does not hold, then
    new grants; then top up its reservation (grants it has not been told of, which need no
    write to hand out later, so such a reply may go before its done refs are durable)."""
    rank = req.rank
    lacking, delivered = _lacking(work, rank, req.held or (), req.want)
    fresh = [work.grant(rank) for _ in range(req.want - len(delivered)) if work.grantable()]
    spare = lacking - len(delivered)
    # A request that wants nothing (a done report) reserves nothing: it may come after
    # its rank ran out of data in the epoch, and a rank holding shards it was never told
    # of would keep its group waiting at the epoch's end (see _settle).
    target = reservation_target(work, reserve, consumption_share(req, work)) if req.want else 0
    reserved = 0
    if spare * 2 < target:  # below half: top up in one go, so one write serves many
        while spare + reserved < target and work.grantable():
            work.grant(rank)
            reserved += 1
    grants = [work.grant_of(e) for e in delivered + fresh]
    left = spare + reserved > 0 or work.grantable()
    status = FetchStatus.OK if grants or left else FetchStatus.EPOCH_DONE
    early = None
    if status is FetchStatus.OK and grants and not fresh:
        early = Early(
            rank=rank,
            epoch=work.epoch,
            incarnation=work.base.incarnation,
            deliveries=tuple([(e.shard, e.attempt) for e in delivered]),
            done=req.done,
        )
    return FetchResult(work.state(), work.reply(status, grants), early, reserved)


def _lacking(
    work: Work, rank: int, held: tuple[ShardRef, ...], want: int
) -> tuple[int, list[InFlightEntry]]:
    """How many of `rank`'s in-flight shards its `held` does not list, and the first `want` of
    them in grant order; it stops at the ones it needs (a full reservation is asked about on
    every request)."""
    known = {(r.shard, r.attempt) for r in held if r.epoch == work.epoch}
    in_flight = work.in_flight
    mine = in_flight.shards_of(rank)
    holding = 0
    for shard, attempt in known:
        entry = in_flight.get(shard)
        if entry is not None and entry.rank == rank and entry.attempt == attempt:
            holding += 1
    delivered: list[InFlightEntry] = []
    if want > 0:
        for shard in mine:
            entry = in_flight[shard]
            if (shard, entry.attempt) not in known:
                delivered.append(entry)
                if len(delivered) == want:
                    break
    return len(mine) - holding, delivered


def consumption_share(req: ShardFetch, work: Work) -> float:
    """The rank's share of the job's consumption: its local batch over the global one
    when it says them, else an even share of the active ranks."""
    if req.local_batch is not None and req.global_batch:
        return req.local_batch / req.global_batch
    base = work.base
    return 1 / max(1, base.world_size - len(base.left))


def reservation_target(work: Work, reserve: int, share: float) -> int:
    """Shards to keep reserved for a rank whose share of the job's consumption is `share`:
    `reserve`, at most a quarter of its share of what is left to grant and its share of
    MAX_RESERVED. Reservations are never taken from a live rank, so a slow rank must not hold
    the epoch's last shards while the others idle."""
    if reserve <= 0:
        return 0
    base = work.base
    grantable = base.num_shards - work.cursor + len(work.requeued)
    # The epsilon keeps an even share exact: 40 * (1/2) / 4 must floor to 5, not 4.
    return min(reserve, int(grantable * share / 4 + 1e-9), int(MAX_RESERVED * share + 1e-9))
