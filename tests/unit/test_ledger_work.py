"""The working copy's in-flight index (work.py): shared with the state it was built for,
never corrupted by a Work that goes on changing, rebuilt when evicted or unknown."""

from __future__ import annotations

import pytest

from antdt.schemas import JobSpec, ShardFetch, ShardRef
from antdt.services.shards import work as work_module
from antdt.services.shards.ledger import LedgerState, new_ledger, plan_fetch
from antdt.services.shards.work import Work, _IndexCache


def ledger(world: int = 3) -> LedgerState:
    spec = JobSpec(job="j", world_size=world, dataset_size=1000, shard_size=10,
                   global_batch=world * 4)  # fmt: skip
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
    after_done = work.state()  # hands its index over: no O(in flight) copy is kept
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


def test_an_evicted_index_is_rebuilt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(work_module, "_INDEXES", _IndexCache(size=1))
    state = ledger()
    other = ledger(world=2)  # evicts `state`'s index
    assert [e.shard for e in Work.of(state).entries_of(2)] == by_rank(state, 2)
    assert [e.shard for e in Work.of(other).entries_of(1)] == by_rank(other, 1)


def test_the_cache_keeps_the_newest_indexes_within_its_entry_bound() -> None:
    """Bounded in entries, not only in indexes: 512 indexes of a 10^4-rank job's 2 * 10^4
    entries held 600 MB. The newest stays, however large: the next operation uses it."""
    cache = _IndexCache(size=512, max_entries=20)
    states = [ledger(world=3) for _ in range(4)]  # 9 entries in flight each
    for state in states:
        Work.of(state)  # a miss: indexed into the module's cache, not this one
        cache.put(state.in_flight, {}, {})
    assert cache.indexed == 18 and cache.get(states[0].in_flight) is None
    assert cache.get(states[2].in_flight) is not None and cache.get(states[3].in_flight) is not None
    huge = ledger(world=10)  # 30 entries: over the bound alone
    cache.put(huge.in_flight, {}, {})
    assert cache.indexed == 30 and cache.get(huge.in_flight) is not None
    assert cache.get(states[3].in_flight) is None


def test_a_position_update_keeps_the_rank_index() -> None:
    state = ledger()
    work = Work.of(state)
    entry = work.entries_of(2)[1]
    work.in_flight[entry.shard] = entry.model_copy(update={"position": 4})
    assert [e.position for e in work.entries_of(2)] == [0, 4, 0]
    assert [e.position for e in work.state().in_flight if e.rank == 2] == [0, 4, 0]
