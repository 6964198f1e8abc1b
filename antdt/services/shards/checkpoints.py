"""Checkpoint commit, restore and release: the ledger exactly once relative to the model.
Commit records each rank's holdings at step S; once every active rank committed, snapshot
S is stored. Restore puts the ledger back to a snapshot in a new incarnation (old
processes fenced); release hands a removed rank's shards back. Pure; see the ledger's
lifecycle in docs/architecture.md."""

from __future__ import annotations

from dataclasses import dataclass

from antdt.schemas import (
    CommitReply,
    ErrorCode,
    ErrorReply,
    ReleaseReply,
    RestoreReply,
    ShardCommit,
    ShardPosition,
    ShardRef,
    ShardRelease,
    ShardRestore,
)
from antdt.schemas.base import WireModel
from antdt.services.shards.inflight import InFlightTable
from antdt.services.shards.ledger import Work, apply_done, check_member, check_refs, error
from antdt.services.shards.ledger import release_rank as requeue_rank
from antdt.services.shards.state import (
    InFlightEntry,
    LedgerState,
    PendingCheckpoint,
    RankCommit,
    shard_range,
)

#: Snapshots kept per job: a model checkpoint written after its ledger snapshot may be
#: lost with the process, so the one before must still be restorable.
DEFAULT_KEEP = 3
#: A commit reply lists the ranks yet to commit when there are at most this many.
WAITING_LISTED = 16


@dataclass(frozen=True)
class Outcome:
    """A ledger operation's result: the new state, the reply, and the snapshots to store
    (step -> state) or drop, all in the same etcd transaction as the state."""

    state: LedgerState
    reply: WireModel | ErrorReply
    store: tuple[tuple[int, LedgerState], ...] = ()
    drop: tuple[int, ...] = ()


def refused(state: LedgerState, reply: ErrorReply) -> Outcome:
    return Outcome(state, reply)


# ------------------------------------------------------------------------- commit


def apply_commit(state: LedgerState, req: ShardCommit, keep: int = DEFAULT_KEEP) -> Outcome:
    """Record rank `req.rank`'s part of the checkpoint at `req.step` (idempotent)."""
    problem = check_member(state, req.job, req.rank, req.incarnation) or check_refs(state, req.done)
    if problem is not None:
        return refused(state, problem)
    if req.step in state.checkpoints:
        return Outcome(state, _commit_reply(state, req.step, complete=True))
    if state.checkpoints and req.step < state.checkpoints[-1]:
        message = f"step {req.step} is before checkpoint {state.checkpoints[-1]}"
        return refused(state, error(ErrorCode.STALE, message))
    pending = state.pending
    if pending is not None and pending.step > req.step:
        return refused(
            state, error(ErrorCode.STALE, f"checkpoint {pending.step} is already pending")
        )
    if pending is not None and pending.step == req.step and pending.has_committed(req.rank):
        return Outcome(state, _commit_reply(state, req.step, complete=False))
    if req.epoch != state.epoch:
        message = f"commit for epoch {req.epoch}; the ledger is at {state.epoch}"
        return refused(state, error(ErrorCode.STALE, message))
    if pending is None or pending.step != req.step:
        pending = PendingCheckpoint(step=req.step, epoch=state.epoch)  # an older one lapsed
    return _record_commit(state, pending, req, keep)


def _record_commit(
    state: LedgerState, pending: PendingCheckpoint, req: ShardCommit, keep: int
) -> Outcome:
    work = Work.of(state.model_copy(update={"pending": pending}))
    problem = apply_done(work, state, req.rank, req.done)
    if problem is not None:
        return refused(state, problem)
    held = _positions_at_step(work, req)
    if isinstance(held, ErrorReply):
        return refused(state, held)
    for entry in held:
        work.in_flight[entry.shard] = entry  # the rank's last committed position
    work.pending = pending.with_commit(RankCommit(rank=req.rank, held=tuple(held)))
    current = work.state()
    assert current.pending is not None
    # Committers are active ranks (check_member), so counting them is enough.
    if current.pending.committed_count() >= current.active_count:
        return _complete(current, current.pending, keep)
    return Outcome(current, _commit_reply(current, req.step, complete=False))


def _positions_at_step(work: Work, req: ShardCommit) -> list[InFlightEntry] | ErrorReply:
    """The rank's in-flight entries with their positions at the step. A held shard the
    rank did not list was granted while its commit was being built: untouched at S."""
    listed = _by_shard(req.positions, work, req.rank)
    if isinstance(listed, ErrorReply):
        return listed
    held = []
    for entry in work.entries_of(req.rank):
        position = listed.pop(entry.shard, entry.position)
        held.append(entry.model_copy(update={"position": position}))
    if listed:  # listed, but not in flight for this rank (any more)
        shard = next(iter(listed))
        return error(ErrorCode.FENCED, f"shard {shard} is not held by rank {req.rank}")
    return held


def _by_shard(
    positions: tuple[ShardPosition, ...], work: Work, rank: int
) -> dict[int, int] | ErrorReply:
    base, out = work.base, {}
    for p in positions:
        if p.epoch != work.epoch or p.shard >= base.num_shards:
            return error(ErrorCode.STALE, f"position for epoch {p.epoch} shard {p.shard}")
        entry = work.in_flight.get(p.shard)
        if entry is None or (entry.rank, entry.attempt) != (rank, p.attempt):
            return error(
                ErrorCode.FENCED, f"shard {p.shard} attempt {p.attempt} is not held by {rank}"
            )
        start, end = shard_range(base, p.shard)
        if not entry.position <= p.position <= end - start:
            return error(
                ErrorCode.BAD_REQUEST,
                f"position {p.position} of shard {p.shard} outside "
                f"[{entry.position}, {end - start}]",
            )
        if p.shard in out:
            return error(ErrorCode.BAD_REQUEST, f"shard {p.shard} listed twice")
        out[p.shard] = p.position
    return out


def _complete(state: LedgerState, pending: PendingCheckpoint, keep: int) -> Outcome:
    in_flight = InFlightTable(
        e for c in sorted(pending.commits, key=lambda c: c.rank) for e in c.held
    )
    requeued = state.requeued + pending.late
    snapshot = state.model_copy(
        update={
            "in_flight": in_flight,
            "requeued": requeued,
            "done_count": state.cursor - len(in_flight) - len(requeued),
            "complete": state.complete and not in_flight and not requeued,
            "checkpoints": (),
            "pending": None,
        }
    )
    snapshot = LedgerState.model_validate(snapshot.model_dump())  # must hold its invariants
    kept = (*state.checkpoints, pending.step)[-keep:]
    dropped = tuple(s for s in state.checkpoints if s not in kept)
    current = state.model_copy(update={"pending": None, "checkpoints": kept})
    return Outcome(
        current,
        _commit_reply(current, pending.step, complete=True, now=True),
        store=((pending.step, snapshot),),
        drop=dropped,
    )


def _commit_reply(
    state: LedgerState, step: int, *, complete: bool, now: bool = False
) -> CommitReply:
    """The reply names the waiting ranks only when they are few: listing them costs
    O(ranks) per commit, and a job of 10^4 ranks commits 10^4 times per checkpoint."""
    count = 0
    waiting_for: tuple[int, ...] = ()
    if not complete and state.pending is not None:
        count = state.active_count - state.pending.committed_count()
        if count <= WAITING_LISTED:
            waiting_for = tuple(sorted(state.active_ranks() - state.pending.committed()))
    return CommitReply(
        job=state.job,
        step=step,
        complete=complete,
        completed_now=now,
        waiting=count,
        waiting_for=waiting_for,
        checkpoints=state.checkpoints,
    )


# ------------------------------------------------------------------------ restore


def apply_restore(
    state: LedgerState,
    req: ShardRestore,
    snapshot: LedgerState | None,
    fresh: LedgerState | None,
) -> Outcome:
    """Start a new incarnation from `snapshot` (checkpoint `req.step`'s, loaded by the shell;
    None: not kept) or from `fresh` (the job's start) when step is None. The same token again
    (another rank of the restart) changes nothing and needs neither: the shell may pass
    fresh=None when it expects the token known, and gets ErrorCode.NOT_READ if it is not."""
    if req.job != state.job or req.rank >= state.world_size:
        return refused(state, error(ErrorCode.BAD_REQUEST, "restore for another job or rank"))
    if req.token == state.restore_token:
        if req.step != state.restored_step:
            message = f"this restart restored step {state.restored_step}, not {req.step}"
            return refused(state, error(ErrorCode.STALE, message))
        return Outcome(state, _restore_reply(state, restored=False))
    if fresh is None:
        return refused(state, error(ErrorCode.NOT_READ, f"restore token {req.token!r} is new here"))
    if req.step is not None and (snapshot is None or req.step not in state.checkpoints):
        message = f"no ledger snapshot for step {req.step}; kept: {list(state.checkpoints)}"
        return refused(state, error(ErrorCode.UNKNOWN_CHECKPOINT, message))
    base = snapshot if req.step is not None and snapshot is not None else fresh
    kept = tuple(s for s in state.checkpoints if req.step is not None and s <= req.step)
    restored = base.model_copy(
        update={
            # A new attempt for everything in flight: the old processes' reports are fenced.
            "in_flight": InFlightTable(
                e.model_copy(update={"attempt": e.attempt + 1}) for e in base.in_flight
            ),
            "incarnation": state.incarnation + 1,
            "restored_step": req.step,
            "restore_token": req.token,
            "checkpoints": kept,
            "pending": None,
            "left": (),
        }
    )
    dropped = tuple(s for s in state.checkpoints if s not in kept)
    return Outcome(restored, _restore_reply(restored, restored=True), drop=dropped)


def _restore_reply(state: LedgerState, *, restored: bool) -> RestoreReply:
    return RestoreReply(
        job=state.job,
        incarnation=state.incarnation,
        step=state.restored_step,
        epoch=state.epoch,
        restored=restored,
    )


# ------------------------------------------------------------------------ release


def apply_release(state: LedgerState, req: ShardRelease) -> Outcome:
    """Remove `req.rank` without a rollback: done refs are applied, every other shard it
    holds goes back from the reported position (else its last committed one)."""
    if req.rank in state.left and req.job == state.job:
        return Outcome(state, ReleaseReply(job=state.job, rank=req.rank, returned=0))
    problem = check_member(state, req.job, req.rank, req.incarnation) or check_refs(state, req.done)
    if problem is not None:
        return refused(state, problem)
    if state.active_count == 1:
        return refused(
            state, error(ErrorCode.BAD_REQUEST, "the last rank of a job cannot be removed")
        )
    work = Work.of(state)
    problem = apply_done(work, state, req.rank, req.done)
    if problem is not None:
        return refused(state, problem)
    listed = _by_shard(req.positions, work, req.rank)
    if isinstance(listed, ErrorReply):
        return refused(state, listed)
    for shard, position in listed.items():
        work.in_flight[shard] = work.in_flight[shard].model_copy(update={"position": position})
    mine = work.entries_of(req.rank)
    for entry in mine:
        start, end = shard_range(state, entry.shard)
        if entry.position == end - start:  # consumed to its end: done, nothing to return
            work.done(entry_ref(work, entry), req.rank)
    current = requeue_rank(work.state(), req.rank)
    current = current.model_copy(update={"left": tuple(sorted({*state.left, req.rank}))})
    returned = len(current.requeued) - len(state.requeued)
    return Outcome(current, ReleaseReply(job=state.job, rank=req.rank, returned=returned))


def entry_ref(work: Work, entry: InFlightEntry) -> ShardRef:
    return ShardRef(epoch=work.epoch, shard=entry.shard, attempt=entry.attempt)
