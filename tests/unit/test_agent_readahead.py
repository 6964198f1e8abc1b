"""Ids a DataLoader read ahead: commits do not count them, a rewind hands them out again
first and in order, and a lot split by a re-cut keeps its shard's end with its last id."""

from __future__ import annotations

from antdt.agent.readahead import ReadAhead
from antdt.agent.sampling import Segment
from antdt.agent.stream_state import StreamState, open_cursors
from antdt.schemas import FetchStatus, ShardGrant, ShardReply

from .test_agent_shard_stream import RecordingLoop, stream


def holding(*grants: ShardGrant) -> StreamState:
    state = StreamState(job="j", rank=0, seed=0, prefetch=len(grants), shard_size=10)
    fetch = state.next_fetch()
    assert fetch is not None
    reply = ShardReply(job="j", epoch=0, status=FetchStatus.OK, grants=grants)
    state.on_reply(fetch, reply, open_cursors(grants, 0))
    return state


A = ShardGrant(epoch=0, shard=0, attempt=0, start=0, end=10)
B = ShardGrant(epoch=0, shard=1, attempt=0, start=10, end=20)


def positions(state: StreamState) -> dict[int, int]:
    return {p.shard: p.position for p in state.positions()}


def test_commit_positions_leave_out_the_ids_read_ahead() -> None:
    shards = stream(holding(A, B), RecordingLoop())
    state = shards._state
    first = shards.take_lot(4, step=0, epoch=0)
    second = shards.take_lot(8, step=1, epoch=0)  # crosses into shard 1, finishing shard 0
    assert first is not None and second is not None
    assert positions(state) == {0: 0, 1: 0}  # nothing trained on yet
    shards.deliver_lot()
    shards.reached(first)
    assert positions(state) == {0: 4, 1: 0}
    shards.deliver_lot()
    assert positions(state) == {0: 4, 1: 0}  # delivered, its step not synced
    shards.reached(second)
    assert positions(state) == {1: 2}  # shard 0 finished: reported done, not positioned
    assert [r.shard for r in state.pending_done] == [0]


def test_a_rewind_hands_the_same_ids_out_again_in_order() -> None:
    shards = stream(holding(A, B), RecordingLoop())
    lots = [shards.take_lot(6, step=s, epoch=0) for s in range(3)]
    taken = [i for lot in lots if lot for i in lot.ids]
    first = lots[0]
    assert first is not None
    shards.deliver_lot()
    shards.reached(first)
    shards.rewind_ahead()  # a plan switch at step 1: re-cut the rest as 4s
    again = [shards.take_lot(4, step=s, epoch=0) for s in (1, 2, 3)]
    assert [i for lot in again if lot for i in lot.ids] == taken[6:]
    for lot in again:
        assert lot is not None
        shards.deliver_lot()
        shards.reached(lot)
    assert positions(shards._state) == {1: 8}  # 2 of shard 1 never taken
    assert [r.shard for r in shards._state.pending_done] == [0]


def test_a_split_segment_keeps_the_shard_end_with_its_last_id() -> None:
    ahead = ReadAhead()
    ahead.returned.append(Segment(A, [1, 2, 3], True))
    head = ahead.take_returned(2)
    assert [(s.ids, s.finishes) for s in head] == [([1, 2], False)]
    assert [(s.ids, s.finishes) for s in ahead.take_returned(5)] == [([3], True)]
    assert not ahead.returned


def test_a_rank_holds_what_it_has_not_handed_to_a_step() -> None:
    """What a rank the plan gives 0 reports in the step's count (TailCatchUp): samples in
    its grants, or read ahead and not delivered; a delivered lot is its step's."""
    shards = stream(holding(A), RecordingLoop())
    assert shards.holds(0) and not shards.holds(-1)  # no grant of an earlier epoch
    lot = shards.take_lot(10, step=0, epoch=0)  # the whole shard, read ahead
    assert lot is not None and shards.holds(0)
    shards.deliver_lot()
    assert not shards.holds(0)
    shards.rewind_ahead()  # its step restarts: handed out again first
    assert shards.holds(0)
