"""The stored ledger's lists as columns (columns.py): round trips, the older format still
read, malformed columns refused, and what it buys a job of 10^4 ranks at a checkpoint."""

from __future__ import annotations

import json
import time

import pytest
from pydantic import ValidationError

from antdt.schemas import JobSpec, ShardCommit, ShardPosition
from antdt.services.shards.checkpoints import WAITING_LISTED, apply_commit
from antdt.services.shards.state import (
    InFlightEntry,
    LedgerState,
    PendingCheckpoint,
    RankCommit,
    Requeued,
    new_ledger,
)

#: etcd's default --max-request-bytes: a ledger write larger than this is refused.
ETCD_MAX_REQUEST = 1536 * 1024


def entry(shard: int, rank: int, position: int = 0) -> InFlightEntry:
    return InFlightEntry(shard=shard, rank=rank, attempt=0, position=position)


def encode(state: LedgerState) -> bytes:
    return LedgerState.__pydantic_serializer__.to_json(state)


def older_format(state: LedgerState) -> bytes:
    """The ledger as stored before columns: every list as JSON objects."""
    return json.dumps(state.model_dump(mode="python")).encode()


def big_job(ranks: int, held: int = 2) -> LedgerState:
    """A job of `ranks` ranks (10^9 samples, 10^4-sample shards) holding `held` shards
    each, built directly: granting them one request at a time takes seconds."""
    spec = JobSpec(
        job="big", world_size=ranks, dataset_size=10**9, shard_size=10**4, global_batch=ranks * 32
    )
    entries = tuple(
        InFlightEntry(shard=i, rank=i // held, attempt=0, position=0) for i in range(ranks * held)
    )
    return new_ledger(spec).model_copy(update={"in_flight": entries, "cursor": len(entries)})


def commit_all_but_one(state: LedgerState, step: int) -> LedgerState:
    """Every rank but the last commits the checkpoint at `step`, half-way through its
    first shard."""
    by_rank: dict[int, list[InFlightEntry]] = {}
    for entry in state.in_flight:
        by_rank.setdefault(entry.rank, []).append(entry)
    for rank in range(state.world_size - 1):
        positions = tuple(
            ShardPosition(epoch=0, shard=e.shard, attempt=e.attempt, position=5000 if i == 0 else 0)
            for i, e in enumerate(by_rank.get(rank, ()))
        )
        req = ShardCommit(job=state.job, rank=rank, step=step, epoch=0, positions=positions)
        state = apply_commit(state, req).state
    return state


def test_a_ledger_with_every_list_filled_round_trips_through_columns() -> None:
    state = big_job(4).model_copy(
        update={
            "requeued": (Requeued(shard=100, position=7, attempt=2),),
            "cursor": 9,
            "pending": PendingCheckpoint(
                step=3,
                epoch=0,
                commits=(
                    RankCommit(rank=1, held=(entry(2, 1, position=4), entry(3, 1))),
                    RankCommit(rank=2),  # held nothing at the step
                ),
                late=(Requeued(shard=5, position=0, attempt=0),),
            ),
        }
    )
    state = LedgerState.model_validate(state.model_dump())  # a valid state, checked
    stored = json.loads(encode(state))
    assert stored["in_flight"]["shard"] == list(range(8))
    assert stored["pending"]["commits"] == {
        "rank": [1, 2],
        "held": [2, 0],
        "shard": [2, 3],
        "attempt": [0, 0],
        "position": [4, 0],
    }
    assert LedgerState.model_validate_json(encode(state)) == state
    # Python-mode dumps keep the objects, for code that dumps and validates in memory.
    assert state.model_dump()["in_flight"][0] == {
        "shard": 0,
        "rank": 0,
        "attempt": 0,
        "position": 0,
    }


def test_a_ledger_stored_before_columns_is_still_read() -> None:
    state = commit_all_but_one(big_job(3), step=4)
    assert LedgerState.model_validate_json(older_format(state)) == state


def test_an_empty_ledger_stays_small() -> None:
    empty = new_ledger(
        JobSpec(job="tiny", world_size=2, dataset_size=10, shard_size=5, global_batch=4)
    )
    assert json.loads(encode(empty))["in_flight"] == []
    assert LedgerState.model_validate_json(encode(empty)) == empty


@pytest.mark.parametrize(
    ("in_flight", "says"),
    [
        (
            {"shard": [1, 2], "rank": [0], "attempt": [0, 0], "position": [0, 0]},
            "different lengths",
        ),
        ({"shard": [1], "rank": [0], "attempt": [0]}, "columns must be"),
        ({"shard": [1], "rank": [0], "attempt": [0], "position": [-1]}, "greater than or equal"),
        ({"shard": 1, "rank": [0], "attempt": [0], "position": [0]}, "must be a list"),
    ],
)
def test_malformed_columns_are_refused_clearly(in_flight: object, says: str) -> None:
    stored = json.loads(encode(big_job(1, held=1)))
    stored["in_flight"] = in_flight
    with pytest.raises(ValidationError, match=says):
        LedgerState.model_validate_json(json.dumps(stored))


def test_commit_columns_must_add_up() -> None:
    state = commit_all_but_one(big_job(3), step=4)
    stored = json.loads(encode(state))
    stored["pending"]["commits"]["held"][0] += 1  # claims an entry the columns lack
    with pytest.raises(ValidationError, match="fewer held entries"):
        LedgerState.model_validate_json(json.dumps(stored))


def test_a_commit_holds_only_its_own_ranks_entries() -> None:
    with pytest.raises(ValidationError, match="another rank"):
        RankCommit(rank=1, held=(InFlightEntry(shard=2, rank=0, attempt=0, position=0),))


def test_a_checkpoint_of_ten_thousand_ranks_fits_one_etcd_request() -> None:
    """10^4 ranks holding two shards each, all but one committed: as JSON objects the
    ledger took 2.3 MB, over etcd's request limit, so the job could write nothing more;
    as columns it stays well under it, and the committing stays cheap per rank."""
    ranks = 10_000
    state = big_job(ranks)
    started = time.process_time()
    pending = commit_all_but_one(state, step=7)
    per_commit_s = (time.process_time() - started) / (ranks - 1)
    assert len(older_format(pending)) > ETCD_MAX_REQUEST  # the bug, for the record
    assert len(encode(pending)) < ETCD_MAX_REQUEST / 2
    # It was 6 ms a commit (three O(ranks) sets per commit): a minute of CPU per checkpoint.
    assert per_commit_s < 0.003, f"{per_commit_s * 1000:.2f} ms per commit"
    last = ShardCommit(job="big", rank=ranks - 1, step=7, epoch=0)
    out = apply_commit(pending, last)
    assert out.reply.complete  # type: ignore[union-attr]
    ((_, snapshot),) = out.store
    assert len(encode(snapshot)) + len(encode(out.state)) < ETCD_MAX_REQUEST  # one txn


def test_a_commit_reply_counts_the_waiting_ranks_and_names_only_a_few() -> None:
    world = WAITING_LISTED + 3
    state = big_job(world, held=1)
    first = apply_commit(state, ShardCommit(job="big", rank=0, step=1, epoch=0))
    assert first.reply.waiting == world - 1 and first.reply.waiting_for == ()  # type: ignore[union-attr]
    state = first.state
    for rank in range(1, 3):
        out = apply_commit(state, ShardCommit(job="big", rank=rank, step=1, epoch=0))
        state = out.state
    reply = out.reply
    assert reply.waiting == WAITING_LISTED  # type: ignore[union-attr]
    assert reply.waiting_for == tuple(range(3, world))  # type: ignore[union-attr]
