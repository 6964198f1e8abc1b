"""A mutable working copy of a ledger, for one pure ledger operation: changed, then built
into the next state or discarded on error. Its in-flight entries are edited through an
InFlightEdit (inflight.py), which the next state shares but for what this one changed."""

from __future__ import annotations

from dataclasses import dataclass, field

from antdt.schemas import (
    ErrorCode,
    ErrorReply,
    FetchStatus,
    ShardGrant,
    ShardRef,
    ShardReply,
    replaced,
    trusted,
)
from antdt.services.shards.inflight import InFlightEdit, InFlightTable
from antdt.services.shards.permutation import index_of, shard_at
from antdt.services.shards.state import (
    InFlightEntry,
    LedgerState,
    PendingCheckpoint,
    Requeued,
    shard_range,
)


def error(code: str, message: str) -> ErrorReply:
    return ErrorReply(code=code, error=message)


@dataclass
class Work:
    """A mutable working copy of a ledger for one request; discarded on error.

    `in_flight` (shard -> entry, in grant order, with each rank's shards) is the
    authority; callers may replace an entry's position in it, never its shard or rank.
    Once `state()` has built the next state from it, it can no longer change."""

    base: LedgerState
    epoch: int
    cursor: int
    done_count: int
    complete: bool
    in_flight: InFlightEdit[InFlightEntry]
    requeued: list[Requeued]
    requeued_shards: set[int] = field(default_factory=set)
    pending: PendingCheckpoint | None = None
    late: list[Requeued] = field(default_factory=list)  # grants to ranks after their commit

    @classmethod
    def of(cls, state: LedgerState) -> Work:
        return cls(
            base=state,
            epoch=state.epoch,
            cursor=state.cursor,
            done_count=state.done_count,
            complete=state.complete,
            in_flight=InFlightTable.of(state.in_flight).edit(),
            requeued=list(state.requeued),
            requeued_shards={r.shard for r in state.requeued} if state.requeued else set(),
            pending=state.pending,
            late=list(state.pending.late) if state.pending else [],
        )

    def entries_of(self, rank: int) -> list[InFlightEntry]:
        """`rank`'s in-flight entries, in grant order."""
        in_flight = self.in_flight
        return [in_flight[shard] for shard in in_flight.shards_of(rank)]

    def done(self, ref: ShardRef, rank: int) -> ErrorReply | None:
        entry = self.in_flight.get(ref.shard)
        if entry is not None:
            if entry.rank != rank or entry.attempt != ref.attempt:
                return error(
                    ErrorCode.FENCED,
                    f"shard {ref.shard} attempt {ref.attempt} is held by rank {entry.rank} "
                    f"as attempt {entry.attempt}",
                )
            del self.in_flight[ref.shard]
            self.done_count += 1
            self._maybe_complete()
            return None
        if ref.shard in self.requeued_shards:
            return error(ErrorCode.FENCED, f"shard {ref.shard} was taken back from its rank")
        base = self.base
        if index_of(base.seed, self.epoch, base.num_shards, ref.shard) < self.cursor:
            return None  # already done: a repeated done is a no-op
        return error(ErrorCode.FENCED, f"shard {ref.shard} was not granted in epoch {self.epoch}")

    def grantable(self) -> bool:
        return bool(self.requeued) or self.cursor < self.base.num_shards

    def grant(self, rank: int) -> InFlightEntry:
        """The next shard (re-queued first, then the epoch's order) granted to `rank`; its
        ShardGrant, if the rank is to be told now, is `grant_of(entry)`."""
        if self.requeued:
            back = self.requeued.pop(0)
            self.requeued_shards.discard(back.shard)
            shard, position, attempt = back.shard, back.position, back.attempt + 1
        else:
            base = self.base
            shard = shard_at(base.seed, self.epoch, base.num_shards, self.cursor)
            position, attempt = 0, 0
            self.cursor += 1
        if self.pending is not None and self.pending.has_committed(rank):
            # Granted after the rank's commit: untouched at the checkpoint's step.
            self.late.append(Requeued(shard=shard, position=position, attempt=attempt))
        # Built unvalidated, as the grant and reply below: values from the validated
        # state, the permutation and ranges checked on the way in (schemas.trusted).
        entry = trusted(
            InFlightEntry, {"shard": shard, "rank": rank, "attempt": attempt, "position": position}
        )
        self.in_flight[shard] = entry
        return entry

    def held_by(self, rank: int) -> list[ShardGrant]:
        """The grants `rank` holds now, from their recorded positions."""
        return [self.grant_of(e) for e in self.entries_of(rank)]

    def grant_of(self, entry: InFlightEntry) -> ShardGrant:
        start, end = shard_range(self.base, entry.shard)
        return trusted(
            ShardGrant,
            {
                "epoch": self.epoch,
                "shard": entry.shard,
                "attempt": entry.attempt,
                "start": start,
                "end": end,
                "position": entry.position,
            },
        )

    def finished(self) -> bool:
        return self.cursor == self.base.num_shards and not self.in_flight and not self.requeued

    def next_epoch(self) -> None:
        self.epoch += 1
        self.cursor = self.done_count = 0
        # Ranks leave an epoch only together, after any checkpoint inside it is complete:
        # a checkpoint still pending here can never complete. Drop it.
        self.pending, self.late = None, []

    def _maybe_complete(self) -> None:
        if self.epoch == self.base.epochs - 1 and self.finished():
            self.complete = True

    def state(self) -> LedgerState:
        """The next state. It shares this Work's in-flight entries, so the Work cannot
        change them any more (TypeError): a Work builds one state."""
        return replaced(
            self.base,
            {
                "epoch": self.epoch,
                "cursor": self.cursor,
                "done_count": self.done_count,
                "complete": self.complete,
                "in_flight": self.in_flight.build(),
                "requeued": tuple(self.requeued),
                "pending": (
                    replaced(self.pending, {"late": tuple(self.late)})
                    if self.pending is not None
                    else None
                ),
            },
        )

    def reply(
        self,
        status: FetchStatus,
        grants: list[ShardGrant] | None = None,
        retry: float = 0.0,
        outstanding: int | None = None,
    ) -> ShardReply:
        return trusted(
            ShardReply,
            {
                "job": self.base.job,
                "epoch": self.epoch,
                "status": status,
                "grants": tuple(grants or ()),
                "retry_after_s": retry,
                "outstanding": outstanding,
            },
        )
