"""The working copy's in-flight entries (work.py): shared with the state it builds,
never corrupted by a Work that goes on changing, indexed alike when decoded."""

from __future__ import annotations

import pytest

from antdt.schemas import JobSpec, ShardFetch, ShardRef
from antdt.services.shards.ledger import LedgerState, new_ledger, plan_fetch
from antdt.services.shards.work import Work


def ledger(world: int = 3) -> LedgerState:
    spec = JobSpec(
        job="j", world_size=world, dataset_size=1000, shard_size=10, global_batch=world * 4
    )
    state = new_ledger(spec)
    for rank in range(world):
        state = plan_fetch(state, ShardFetch(job="j", rank=rank, epoch=0, want=3)).state
    return state


def by_rank(state: LedgerState, rank: int) -> list[int]:
    return [e.shard for e in state.in_flight if e.rank == rank]


def test_a_state_decoded_from_json_is_indexed_like_the_one_built() -> None:
    state = ledger()
    decoded = LedgerState.model_validate_json(state.model_dump_json())
    for rank in range(3):
        assert [e.shard for e in Work.of(decoded).entries_of(rank)] == by_rank(state, rank)


def test_changing_a_work_after_state_fails_and_leaves_that_states_index_alone() -> None:
    state = ledger()
    work = Work.of(state)
    mine = work.entries_of(1)
    work.done(ShardRef(epoch=0, shard=mine[0].shard, attempt=0), 1)
    after_done = work.state()  # shares its entries: the Work cannot change them now
    with pytest.raises(TypeError):
        work.grant(1)
    with pytest.raises(TypeError):
        work.done(ShardRef(epoch=0, shard=mine[1].shard, attempt=0), 1)
    assert [e.shard for e in work.entries_of(1)] == by_rank(after_done, 1)  # still readable
    assert [e.shard for e in Work.of(after_done).entries_of(1)] == by_rank(after_done, 1)
    assert [e.shard for e in Work.of(state).entries_of(1)] == by_rank(state, 1)
    assert len(by_rank(after_done, 1)) == 2 and len(by_rank(state, 1)) == 3


def test_two_works_of_one_state_do_not_see_each_other() -> None:
    state = ledger()
    first, second = Work.of(state), Work.of(state)
    shard = first.entries_of(0)[0].shard
    first.done(ShardRef(epoch=0, shard=shard, attempt=0), 0)
    assert shard in [e.shard for e in second.entries_of(0)]
    assert shard in second.in_flight


def test_a_position_update_keeps_the_rank_index() -> None:
    state = ledger()
    work = Work.of(state)
    entry = work.entries_of(2)[1]
    work.in_flight[entry.shard] = entry.model_copy(update={"position": 4})
    assert [e.position for e in work.entries_of(2)] == [0, 4, 0]
    assert [e.position for e in work.state().in_flight if e.rank == 2] == [0, 4, 0]
