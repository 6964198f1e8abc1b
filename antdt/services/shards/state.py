"""The shard ledger's state: pure, JSON-serialisable, compact. A cursor into the epoch's
shard order (permutation.py), the re-queued and in-flight shards and counts, never an
entry per shard: every shard before the cursor is done, in flight or re-queued. A shard's
lifecycle (TODO, DOING, DONE, REQUEUED) is drawn in docs/architecture.md."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, model_validator
from pydantic_core import core_schema

from antdt.schemas import InFlight, JobSpec, ShardStatus
from antdt.schemas.base import Token
from antdt.services.shards.columns import commit_columns, entry_columns
from antdt.services.shards.inflight import InFlightTable

NonNegative = Annotated[int, Field(ge=0)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Requeued(_Frozen):
    """A shard to be granted again from `position` (its rank was removed, or a restore
    put it back); the next grant gets attempt + 1, fencing every earlier holder."""

    shard: NonNegative
    position: NonNegative
    attempt: NonNegative = Field(description="The last attempt granted")


_REQUEUED = entry_columns(("shard", "position", "attempt"))
Requeues = Annotated[tuple[Requeued, ...], _REQUEUED.read, _REQUEUED.write]


class InFlightEntry(_Frozen):
    """A shard granted to `rank` as `attempt`; `position` is where it resumes: the grant's
    position until the rank commits a checkpoint, then how far the model got."""

    shard: NonNegative
    rank: NonNegative
    attempt: NonNegative
    position: NonNegative


class _AsInFlight:
    """Pydantic schema of a ledger's in-flight entries: validated as a tuple of entries
    (or taken as an InFlightTable), held as an InFlightTable (inflight.py), dumped as a tuple."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        entries = handler.generate_schema(tuple[InFlightEntry, ...])
        from_entries = core_schema.no_info_after_validator_function(InFlightTable, entries)
        return core_schema.json_or_python_schema(
            json_schema=from_entries,
            python_schema=core_schema.union_schema(
                [core_schema.is_instance_schema(InFlightTable), from_entries]
            ),
            serialization=core_schema.plain_serializer_function_ser_schema(
                _entries, return_schema=entries
            ),
        )


def _entries(value: Any) -> tuple[Any, ...]:
    # A tuple too: model_copy(update=...) takes what it is given, unvalidated.
    return value.items() if isinstance(value, InFlightTable) else tuple(value)


_IN_FLIGHT = entry_columns(("shard", "rank", "attempt", "position"))
InFlightEntries = Annotated[
    InFlightTable[InFlightEntry], _AsInFlight(), _IN_FLIGHT.read, _IN_FLIGHT.write
]


class RankCommit(_Frozen):
    """One rank's part of a pending checkpoint: what it held at the step, and how far."""

    rank: NonNegative
    held: tuple[InFlightEntry, ...] = ()

    @model_validator(mode="after")
    def _own_entries(self) -> RankCommit:
        # Stored as columns, an entry's rank is its commit's (columns.py).
        if any(entry.rank != self.rank for entry in self.held):
            raise ValueError(f"a commit of rank {self.rank} holds another rank's entry")
        return self


_COMMITS = commit_columns()
RankCommits = Annotated[tuple[RankCommit, ...], _COMMITS.read, _COMMITS.write]


class PendingCheckpoint(_Frozen):
    """A checkpoint some ranks have committed. `late` records the grants made to ranks
    after their commit, as they were before the grant: at the step they were untouched."""

    step: NonNegative
    epoch: NonNegative
    commits: RankCommits = ()
    late: Requeues = ()

    def has_committed(self, rank: int) -> bool:
        """Asked on every commit and every grant while the checkpoint is pending: a bit
        of a mask built once per `commits` tuple (see _COMMITTED)."""
        return bool(committed_mask(self.commits) >> rank & 1)

    def committed_count(self) -> int:
        return committed_mask(self.commits).bit_count()

    def committed(self) -> frozenset[int]:
        """The ranks that committed (O(ranks): for listing them)."""
        mask = committed_mask(self.commits)
        return frozenset(r for r in range(mask.bit_length()) if mask >> r & 1)

    def with_commit(self, commit: RankCommit) -> PendingCheckpoint:
        """The checkpoint with `commit` added; its mask is this one's with the
        committer's bit set, so that a checkpoint of n ranks costs O(n), not O(n^2)."""
        commits = (*self.commits, commit)
        committed_mask(commits, known=committed_mask(self.commits) | 1 << commit.rank)
        return self.model_copy(update={"commits": commits})


class LedgerState(_Frozen):
    """One job's ledger: stored at jobs/{job}/ledger/state, a snapshot per checkpoint."""

    job: Token
    world_size: int = Field(ge=1)
    epoch: NonNegative
    epochs: int = Field(ge=1)
    num_shards: int = Field(ge=1)
    dataset_size: int = Field(ge=1)
    shard_size: int = Field(ge=1)
    seed: NonNegative
    cursor: int = Field(ge=0, description="Shards of the epoch's order handed out so far")
    requeued: Requeues = ()
    in_flight: InFlightEntries = Field(default_factory=InFlightTable)
    done_count: int = Field(ge=0, description="Shards of the current epoch done")
    complete: bool = False
    incarnation: NonNegative = Field(default=0, description="Restores so far")
    restored_step: NonNegative | None = Field(
        default=None, description="The checkpoint the current incarnation started from"
    )
    restore_token: str | None = Field(default=None, description="The last restore's token")
    checkpoints: tuple[NonNegative, ...] = Field(default=(), description="Snapshot steps")
    pending: PendingCheckpoint | None = None
    left: tuple[NonNegative, ...] = Field(default=(), description="Ranks removed")

    @model_validator(mode="after")
    def _consistent(self) -> LedgerState:
        if self.num_shards != ceil_div(self.dataset_size, self.shard_size):
            raise ValueError("num_shards does not match dataset_size / shard_size")
        if not self.epoch < self.epochs or not self.cursor <= self.num_shards:
            raise ValueError("epoch or cursor out of range")
        open_shards = [e.shard for e in self.in_flight] + [r.shard for r in self.requeued]
        if len(set(open_shards)) != len(open_shards) or any(
            shard >= self.num_shards for shard in open_shards
        ):
            raise ValueError("a shard is listed twice, or out of range")
        ranks = [e.rank for e in self.in_flight] + list(self.left)
        if self.pending is not None:
            ranks += [c.rank for c in self.pending.commits]
        if any(rank >= self.world_size for rank in ranks):
            raise ValueError("a rank outside the job")
        if self.done_count + len(open_shards) != self.cursor:
            raise ValueError("done + in flight + re-queued must equal the cursor")
        if self.complete and (self.epoch != self.epochs - 1 or not finished(self)):
            raise ValueError("complete, but the last epoch is not done")
        if list(self.checkpoints) != sorted(set(self.checkpoints)):
            raise ValueError("checkpoints must be strictly increasing")
        return self

    def active_ranks(self) -> set[int]:
        return set(range(self.world_size)) - set(self.left)

    @property
    def active_count(self) -> int:
        """len(active_ranks()), without building the set: `left` holds job ranks only."""
        return self.world_size - len(self.left)

    @property
    def todo_count(self) -> int:
        """Shards of the current epoch waiting to be granted (never granted, or handed
        back and re-queued)."""
        return self.num_shards - self.cursor + len(self.requeued)


#: commits tuple id -> (the tuple, its ranks). Identity-keyed, as work.py's index: the
#: tuple is held here, so its id is not reused while cached. A few per pending checkpoint.
_COMMITTED: dict[int, tuple[tuple[RankCommit, ...], int]] = {}
_COMMITTED_MAX = 64


def committed_mask(commits: tuple[RankCommit, ...], known: int | None = None) -> int:
    """The ranks of `commits` as the bits of an int; `known`: already computed by the
    caller (cached as such)."""
    hit = _COMMITTED.get(id(commits))
    if hit is not None and hit[0] is commits:
        return hit[1]
    mask = known
    if mask is None:
        mask = 0
        for commit in commits:
            mask |= 1 << commit.rank
    if len(_COMMITTED) >= _COMMITTED_MAX:
        _COMMITTED.clear()
    _COMMITTED[id(commits)] = (commits, mask)
    return mask


def new_ledger(spec: JobSpec) -> LedgerState:
    """The ledger of a job that has not started: epoch 0, nothing handed out."""
    return LedgerState(
        job=spec.job,
        world_size=spec.world_size,
        epoch=0,
        epochs=spec.epochs,
        num_shards=ceil_div(spec.dataset_size, spec.shard_size),
        dataset_size=spec.dataset_size,
        shard_size=spec.shard_size,
        seed=spec.seed,
        cursor=0,
        done_count=0,
    )


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)  # exact for any size, unlike math.ceil(a / b)


def finished(state: LedgerState) -> bool:
    return state.cursor == state.num_shards and not state.in_flight and not state.requeued


def shard_range(state: LedgerState, shard: int) -> tuple[int, int]:
    """Sample ids [start, end) of `shard`; the last shard may be short."""
    if not 0 <= shard < state.num_shards:
        raise ValueError(f"shard {shard} outside [0, {state.num_shards})")
    start = shard * state.shard_size
    return start, min(start + state.shard_size, state.dataset_size)


def status(state: LedgerState, ranks: tuple[int, ...] = (), limit: int = 2000) -> ShardStatus:
    """The ledger as `antdt shards status` shows it: the in-flight shards of `ranks` (all
    when empty), lowest ranks first, at most `limit` of them, and how many in all."""
    pending = state.pending
    wanted = set(ranks)
    listed = sorted(
        (e for e in state.in_flight if not wanted or e.rank in wanted), key=lambda e: e.rank
    )[:limit]
    return ShardStatus(
        job=state.job,
        epoch=state.epoch,
        epochs=state.epochs,
        num_shards=state.num_shards,
        done=state.done_count,
        todo=state.todo_count,
        in_flight=tuple(
            InFlight(rank=e.rank, shard=e.shard, attempt=e.attempt, position=e.position)
            for e in listed
        ),
        in_flight_total=len(state.in_flight),
        complete=state.complete,
        incarnation=state.incarnation,
        checkpoints=state.checkpoints,
        pending_checkpoint=pending.step if pending else None,
        committed_ranks=tuple(sorted(pending.committed())) if pending else (),
        left=state.left,
    )
