"""The shard ledger of one job (DESIGN.md section 6): a pure, JSON-serialisable state.

Compact at any dataset size: the epoch's shard order is a seeded permutation computed on
demand (see permutation.py), so the ledger holds a cursor into that order, the shards
re-queued from removed ranks, the shards in flight, and counts; never one entry per
shard. Every shard before the cursor is exactly one of: done, in flight, re-queued.

A request is judged as a whole: any error (ErrorReply with code bad_request, fenced or
stale) leaves the ledger untouched, so a client may always retry the same request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from antdt.schemas import (
    ErrorReply,
    FetchStatus,
    InFlight,
    JobSpec,
    ShardFetch,
    ShardGrant,
    ShardRef,
    ShardReply,
    ShardStatus,
)
from antdt.schemas.base import Token
from antdt.services.shards.permutation import index_of, shard_at

#: How long a rank asking for the next epoch too early should wait before asking again.
PENDING_RETRY_S = 0.05

NonNegative = Annotated[int, Field(ge=0)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Requeued(_Frozen):
    """A shard handed back (its rank was removed): granted again from `position`."""

    shard: NonNegative
    position: NonNegative
    attempt: NonNegative = Field(description="The attempt that was revoked")


class InFlightEntry(_Frozen):
    """A shard granted to `rank` as `attempt`, to be consumed from `position`."""

    shard: NonNegative
    rank: NonNegative
    attempt: NonNegative
    position: NonNegative


class LedgerState(_Frozen):
    """One job's ledger: stored at jobs/{job}/ledger/state, snapshot per checkpoint."""

    job: Token
    world_size: int = Field(ge=1)
    epoch: NonNegative
    epochs: int = Field(ge=1)
    num_shards: int = Field(ge=1)
    dataset_size: int = Field(ge=1)
    shard_size: int = Field(ge=1)
    seed: NonNegative
    cursor: int = Field(ge=0, description="Shards of the epoch's order handed out so far")
    requeued: tuple[Requeued, ...] = ()
    in_flight: tuple[InFlightEntry, ...] = ()
    done_count: int = Field(ge=0, description="Shards of the current epoch done")
    complete: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> LedgerState:
        if self.num_shards != _ceil_div(self.dataset_size, self.shard_size):
            raise ValueError("num_shards does not match dataset_size / shard_size")
        if not self.epoch < self.epochs or not self.cursor <= self.num_shards:
            raise ValueError("epoch or cursor out of range")
        open_shards = [e.shard for e in self.in_flight] + [r.shard for r in self.requeued]
        if len(set(open_shards)) != len(open_shards) or any(
            shard >= self.num_shards for shard in open_shards
        ):
            raise ValueError("a shard is listed twice, or out of range")
        if any(e.rank >= self.world_size for e in self.in_flight):
            raise ValueError("in-flight rank outside the job")
        if self.done_count + len(open_shards) != self.cursor:
            raise ValueError("done + in flight + re-queued must equal the cursor")
        if self.complete and (self.epoch != self.epochs - 1 or not _finished(self)):
            raise ValueError("complete, but the last epoch is not done")
        return self


def new_ledger(spec: JobSpec) -> LedgerState:
    """The ledger of a job that has not started: epoch 0, nothing handed out."""
    return LedgerState(
        job=spec.job,
        world_size=spec.world_size,
        epoch=0,
        epochs=spec.epochs,
        num_shards=_ceil_div(spec.dataset_size, spec.shard_size),
        dataset_size=spec.dataset_size,
        shard_size=spec.shard_size,
        seed=spec.seed,
        cursor=0,
        done_count=0,
    )


def shard_range(state: LedgerState, shard: int) -> tuple[int, int]:
    """Sample ids [start, end) of `shard`; the last shard may be short."""
    if not 0 <= shard < state.num_shards:
        raise ValueError(f"shard {shard} outside [0, {state.num_shards})")
    start = shard * state.shard_size
    return start, min(start + state.shard_size, state.dataset_size)


def status(state: LedgerState) -> ShardStatus:
    return ShardStatus(
        job=state.job,
        epoch=state.epoch,
        num_shards=state.num_shards,
        done=state.done_count,
        todo=state.num_shards - state.cursor + len(state.requeued),
        in_flight=tuple(
            InFlight(rank=e.rank, shard=e.shard, attempt=e.attempt, position=e.position)
            for e in state.in_flight
        ),
    )


def release_rank(state: LedgerState, rank: int) -> LedgerState:
    """Hand a removed rank's in-flight shards back, to be granted again from their
    recorded position (with a new attempt, so the old holder is fenced)."""
    mine = [e for e in state.in_flight if e.rank == rank]
    if not mine:
        return state
    back = tuple(Requeued(shard=e.shard, position=e.position, attempt=e.attempt) for e in mine)
    return state.model_copy(
        update={
            "in_flight": tuple(e for e in state.in_flight if e.rank != rank),
            "requeued": state.requeued + back,
        }
    )


def apply_fetch(state: LedgerState, req: ShardFetch) -> tuple[LedgerState, ShardReply | ErrorReply]:
    """Account the request's done shards, then grant up to `want` new ones.

    Epochs: the rank's epoch equal to the ledger's gets grants (EPOCH_DONE when none is
    left); the next epoch starts once the current one is complete (PENDING until then,
    JOB_DONE after the last); an earlier epoch gets EPOCH_DONE; a later one is stale.
    """
    work = _Work.of(state)
    error = _check_request(state, req) or _apply_done(work, state, req)
    if error is not None:
        return state, error
    if req.epoch < state.epoch:
        return work.state(), work.reply(FetchStatus.EPOCH_DONE)
    if req.epoch == state.epoch + 1:
        if not work.finished():
            return work.state(), work.reply(FetchStatus.PENDING, retry=PENDING_RETRY_S)
        if state.epoch + 1 >= state.epochs:
            work.complete = True
            return work.state(), work.reply(FetchStatus.JOB_DONE)
        work.next_epoch()
    if work.complete:
        return work.state(), work.reply(FetchStatus.JOB_DONE)
    return _grant(work, req)


# ------------------------------------------------------------------- internals


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)  # exact for any size, unlike math.ceil(a / b)


def _finished(state: LedgerState) -> bool:
    return state.cursor == state.num_shards and not state.in_flight and not state.requeued


def _error(code: str, message: str) -> ErrorReply:
    return ErrorReply(code=code, error=message)


def _check_request(state: LedgerState, req: ShardFetch) -> ErrorReply | None:
    if req.job != state.job:
        return _error("bad_request", f"request for job {req.job!r} sent to {state.job!r}")
    if req.rank >= state.world_size:
        return _error("bad_request", f"rank {req.rank} outside world size {state.world_size}")
    if req.epoch > state.epoch + 1:
        return _error("stale", f"epoch {req.epoch} is ahead of the ledger's {state.epoch}")
    for ref in req.done:
        if ref.shard >= state.num_shards:
            return _error("bad_request", f"shard {ref.shard} outside [0, {state.num_shards})")
    return None


def _apply_done(work: _Work, state: LedgerState, req: ShardFetch) -> ErrorReply | None:
    """Mark the request's done refs on `work`; the first bad one aborts the request."""
    for ref in req.done:
        if ref.epoch == state.epoch:
            error = work.done(ref, req.rank)
            if error is not None:
                return error
        elif ref.epoch + 1 != state.epoch:
            return _error("stale", f"done for epoch {ref.epoch}; the ledger is at {state.epoch}")
        # The previous epoch was complete before the ledger advanced: a late or repeated
        # done for it is an idempotent no-op.
    return None


def _grant(work: _Work, req: ShardFetch) -> tuple[LedgerState, ShardReply]:
    # Every reply re-sends what the rank already holds: a reply lost in flight (timeout,
    # NATS restart) must not strand its shards in DOING. Agents ignore grants seen before.
    # The status speaks of new work only: EPOCH_DONE still means "nothing new to grant".
    held = work.held_by(req.rank)
    fresh = [work.grant(req.rank) for _ in range(req.want) if work.grantable()]
    status = FetchStatus.OK if fresh or work.grantable() else FetchStatus.EPOCH_DONE
    return work.state(), work.reply(status, held + fresh)


@dataclass
class _Work:
    """A mutable working copy of a ledger for one request; discarded on error."""

    base: LedgerState
    epoch: int
    cursor: int
    done_count: int
    complete: bool
    in_flight: dict[int, InFlightEntry]  # shard -> entry, in grant order
    requeued: list[Requeued]
    requeued_shards: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, state: LedgerState) -> _Work:
        return cls(
            base=state,
            epoch=state.epoch,
            cursor=state.cursor,
            done_count=state.done_count,
            complete=state.complete,
            in_flight={e.shard: e for e in state.in_flight},
            requeued=list(state.requeued),
            requeued_shards={r.shard for r in state.requeued},
        )

    def done(self, ref: ShardRef, rank: int) -> ErrorReply | None:
        entry = self.in_flight.get(ref.shard)
        if entry is not None:
            if (entry.rank, entry.attempt) != (rank, ref.attempt):
                return _error(
                    "fenced",
                    f"shard {ref.shard} attempt {ref.attempt} is held by rank {entry.rank} "
                    f"as attempt {entry.attempt}",
                )
            del self.in_flight[ref.shard]
            self.done_count += 1
            self._maybe_complete()
            return None
        if ref.shard in self.requeued_shards:
            return _error("fenced", f"shard {ref.shard} was taken back from its rank")
        base = self.base
        if index_of(base.seed, self.epoch, base.num_shards, ref.shard) < self.cursor:
            return None  # already done: a repeated done is a no-op
        return _error("fenced", f"shard {ref.shard} was not granted in epoch {self.epoch}")

    def grantable(self) -> bool:
        return bool(self.requeued) or self.cursor < self.base.num_shards

    def grant(self, rank: int) -> ShardGrant:
        if self.requeued:
            back = self.requeued.pop(0)
            self.requeued_shards.discard(back.shard)
            shard, position, attempt = back.shard, back.position, back.attempt + 1
        else:
            base = self.base
            shard = shard_at(base.seed, self.epoch, base.num_shards, self.cursor)
            position, attempt = 0, 0
            self.cursor += 1
        self.in_flight[shard] = InFlightEntry(
            shard=shard, rank=rank, attempt=attempt, position=position
        )
        start, end = shard_range(self.base, shard)
        return ShardGrant(
            epoch=self.epoch, shard=shard, attempt=attempt, start=start, end=end, position=position
        )

    def held_by(self, rank: int) -> list[ShardGrant]:
        """The grants `rank` holds now, from their recorded positions."""
        grants = []
        for entry in self.in_flight.values():
            if entry.rank == rank:
                start, end = shard_range(self.base, entry.shard)
                grants.append(
                    ShardGrant(
                        epoch=self.epoch,
                        shard=entry.shard,
                        attempt=entry.attempt,
                        start=start,
                        end=end,
                        position=entry.position,
                    )
                )
        return grants

    def finished(self) -> bool:
        return self.cursor == self.base.num_shards and not self.in_flight and not self.requeued

    def next_epoch(self) -> None:
        self.epoch += 1
        self.cursor = self.done_count = 0

    def _maybe_complete(self) -> None:
        if self.epoch == self.base.epochs - 1 and self.finished():
            self.complete = True

    def state(self) -> LedgerState:
        return self.base.model_copy(
            update={
                "epoch": self.epoch,
                "cursor": self.cursor,
                "done_count": self.done_count,
                "complete": self.complete,
                "in_flight": tuple(self.in_flight.values()),
                "requeued": tuple(self.requeued),
            }
        )

    def reply(
        self, status: FetchStatus, grants: list[ShardGrant] | None = None, retry: float = 0.0
    ) -> ShardReply:
        return ShardReply(
            job=self.base.job,
            epoch=self.epoch,
            status=status,
            grants=tuple(grants or ()),
            retry_after_s=retry,
        )
