"""A mutable working copy of a ledger, for one pure ledger operation.

An operation copies the stored state into a Work, changes it, and builds the next state
from it (or discards it on error). Copying must not cost O(in-flight) in Python per
request: a busy job has hundreds of shards in flight and a request every few tens of
microseconds. So each state's in-flight tuple has an index (shard -> entry, rank ->
its shards) kept in a small identity-keyed cache: Work.state() leaves the index it
maintained for the state it builds, and Work.of() of that state copies it with C-level
dict copies instead of rebuilding it. A state the cache does not know (decoded from
etcd, built by hand) is indexed once.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from types import MappingProxyType

from antdt.schemas import ErrorReply, FetchStatus, ShardGrant, ShardRef, ShardReply
from antdt.services.shards.permutation import index_of, shard_at
from antdt.services.shards.state import (
    InFlightEntry,
    LedgerState,
    PendingCheckpoint,
    Requeued,
    shard_range,
)

#: rank -> its in-flight shards, in grant order (a dict used as an ordered set).
RankShards = dict[int, dict[int, None]]
_Indexed = tuple[tuple[InFlightEntry, ...], dict[int, InFlightEntry], RankShards]


def error(code: str, message: str) -> ErrorReply:
    return ErrorReply(code=code, error=message)


class _IndexCache:
    """Indexes of recent in-flight tuples, keyed by identity (a tuple is immutable, and
    the cache holds it, so its id cannot be reused while cached). LRU, bounded both in
    indexes and in the in-flight entries they index: an index costs about 50 bytes per
    entry, and a job of 10^4 ranks has 2 * 10^4 entries in flight, so 512 of its indexes
    held 600 MB. Each operation uses the index of the state the last one built, so a few
    per job are enough; an evicted one is rebuilt when needed."""

    def __init__(self, size: int, max_entries: int = 1 << 17) -> None:
        self.size = size
        self.max_entries = max_entries
        self.indexed = 0  # in-flight entries of the cached indexes, together
        self._entries: OrderedDict[int, _Indexed] = OrderedDict()

    def get(
        self, in_flight: tuple[InFlightEntry, ...]
    ) -> tuple[dict[int, InFlightEntry], RankShards] | None:
        hit = self._entries.get(id(in_flight))
        if hit is None or hit[0] is not in_flight:
            return None
        self._entries.move_to_end(id(in_flight))
        return hit[1], hit[2]

    def put(
        self,
        in_flight: tuple[InFlightEntry, ...],
        by_shard: dict[int, InFlightEntry],
        by_rank: RankShards,
    ) -> None:
        replaced = self._entries.pop(id(in_flight), None)
        if replaced is not None:
            self.indexed -= len(replaced[0])
        self._entries[id(in_flight)] = (in_flight, by_shard, by_rank)
        self.indexed += len(in_flight)
        while len(self._entries) > 1 and (
            len(self._entries) > self.size or self.indexed > self.max_entries
        ):
            _, (evicted, _, _) = self._entries.popitem(last=False)
            self.indexed -= len(evicted)


#: A few per job a replica serves (stored, working, a snapshot or two): jobs beyond that
#: only pay for re-indexing.
_INDEXES = _IndexCache(size=512)


def _index(in_flight: tuple[InFlightEntry, ...]) -> tuple[dict[int, InFlightEntry], RankShards]:
    cached = _INDEXES.get(in_flight)
    if cached is not None:
        return cached
    by_shard = {e.shard: e for e in in_flight}
    by_rank: RankShards = {}
    for e in in_flight:
        by_rank.setdefault(e.rank, {})[e.shard] = None
    _INDEXES.put(in_flight, by_shard, by_rank)
    return by_shard, by_rank


@dataclass
class Work:
    """A mutable working copy of a ledger for one request; discarded on error.

    `in_flight` (shard -> entry, in grant order) is the authority; callers may replace
    an entry's position in it, never its shard or rank. `_ranks` indexes it by rank;
    its inner dicts are shared with the cached index until this Work changes them."""

    base: LedgerState
    epoch: int
    cursor: int
    done_count: int
    complete: bool
    in_flight: dict[int, InFlightEntry]
    requeued: list[Requeued]
    requeued_shards: set[int] = field(default_factory=set)
    pending: PendingCheckpoint | None = None
    late: list[Requeued] = field(default_factory=list)  # grants to ranks after their commit
    _ranks: RankShards = field(default_factory=dict)
    _owned: set[int] = field(default_factory=set)  # ranks whose shard dict is our own copy

    @classmethod
    def of(cls, state: LedgerState) -> Work:
        by_shard, by_rank = _index(state.in_flight)
        return cls(
            base=state,
            epoch=state.epoch,
            cursor=state.cursor,
            done_count=state.done_count,
            complete=state.complete,
            # .copy(), not dict(): it clones a dict that had deletions (every index has)
            # in one block copy, where dict() re-inserts entry by entry, 8x slower.
            in_flight=by_shard.copy(),
            requeued=list(state.requeued),
            requeued_shards={r.shard for r in state.requeued} if state.requeued else set(),
            pending=state.pending,
            late=list(state.pending.late) if state.pending else [],
            _ranks=by_rank.copy(),
        )

    def entries_of(self, rank: int) -> list[InFlightEntry]:
        """`rank`'s in-flight entries, in grant order."""
        in_flight = self.in_flight
        return [in_flight[shard] for shard in self._ranks.get(rank, ())]

    def _shards_of(self, rank: int) -> dict[int, None]:
        """`rank`'s shard set, copied first if still shared with the cache."""
        if rank not in self._owned:
            self._ranks[rank] = dict(self._ranks.get(rank, ()))
            self._owned.add(rank)
        return self._ranks[rank]

    def done(self, ref: ShardRef, rank: int) -> ErrorReply | None:
        entry = self.in_flight.get(ref.shard)
        if entry is not None:
            if entry.rank != rank or entry.attempt != ref.attempt:
                return error(
                    "fenced",
                    f"shard {ref.shard} attempt {ref.attempt} is held by rank {entry.rank} "
                    f"as attempt {entry.attempt}",
                )
            del self.in_flight[ref.shard]
            del self._shards_of(rank)[ref.shard]
            self.done_count += 1
            self._maybe_complete()
            return None
        if ref.shard in self.requeued_shards:
            return error("fenced", f"shard {ref.shard} was taken back from its rank")
        base = self.base
        if index_of(base.seed, self.epoch, base.num_shards, ref.shard) < self.cursor:
            return None  # already done: a repeated done is a no-op
        return error("fenced", f"shard {ref.shard} was not granted in epoch {self.epoch}")

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
        if self.pending is not None and rank in self.pending.committed():
            # Granted after the rank's commit: untouched at the checkpoint's step.
            self.late.append(Requeued(shard=shard, position=position, attempt=attempt))
        entry = InFlightEntry(shard=shard, rank=rank, attempt=attempt, position=position)
        self.in_flight[shard] = entry
        self._shards_of(rank)[shard] = None
        return entry

    def held_by(self, rank: int) -> list[ShardGrant]:
        """The grants `rank` holds now, from their recorded positions."""
        return [self.grant_of(e) for e in self.entries_of(rank)]

    def grant_of(self, entry: InFlightEntry) -> ShardGrant:
        start, end = shard_range(self.base, entry.shard)
        return ShardGrant(
            epoch=self.epoch, shard=entry.shard, attempt=entry.attempt, start=start, end=end,
            position=entry.position,
        )  # fmt: skip

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
        """The next state. Its index is this Work's, handed over: the Work keeps read-only
        views of it, so that changing the Work afterwards fails instead of corrupting the
        cached index (copying it instead would cost O(in flight) per operation)."""
        in_flight = tuple(self.in_flight.values())
        _INDEXES.put(in_flight, self.in_flight, self._ranks)
        self.in_flight = MappingProxyType(self.in_flight)  # type: ignore[assignment]
        self._ranks = MappingProxyType(self._ranks)  # type: ignore[assignment]
        self._owned = set()  # so a change of a rank's shards goes through the view
        return self.base.model_copy(
            update={
                "epoch": self.epoch,
                "cursor": self.cursor,
                "done_count": self.done_count,
                "complete": self.complete,
                "in_flight": in_flight,
                "requeued": tuple(self.requeued),
                "pending": (
                    self.pending.model_copy(update={"late": tuple(self.late)})
                    if self.pending is not None
                    else None
                ),
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
