"""The shard stream's hand-off between the training thread and the fetcher (no I/O: the
fetcher's loop is a recorder of the wakes it is sent)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from antdt.agent.sampling import Taken
from antdt.agent.shards import ShardStream
from antdt.agent.stream_state import StreamState, open_cursors
from antdt.schemas import FetchStatus, ShardGrant, ShardReply


class RecordingLoop:
    """Stands in for the agent's loop: records each wake the training thread sends."""

    def __init__(self) -> None:
        self.wakes: list[Callable[[], Any]] = []

    def call_soon_threadsafe(self, callback: Callable[[], Any]) -> None:
        self.wakes.append(callback)


def holding_one_of_two() -> StreamState:
    """A rank that holds one grant of 100 samples and wants a second (prefetch 2)."""
    state = StreamState(job="j", rank=0, seed=0, prefetch=2, shard_size=100)
    fetch = state.next_fetch()
    assert fetch is not None
    grant = ShardGrant(epoch=0, shard=0, attempt=0, start=0, end=100)
    reply = ShardReply(job="j", epoch=0, status=FetchStatus.OK, grants=(grant,))
    state.on_reply(fetch, reply, open_cursors((grant,), 0))
    assert state.needs_fetch()
    return state


def stream(state: StreamState, loop: RecordingLoop) -> ShardStream:
    return ShardStream(state, bus=cast(Any, None), route=cast(Any, None), loop=cast(Any, loop))


def test_steps_wake_the_fetcher_once_until_it_has_looked() -> None:
    """While a fetch is wanted, every take used to send a wake (a self-pipe write on the
    training thread); one on its way is enough, since the fetcher reads the state after."""
    loop = RecordingLoop()
    s = stream(holding_one_of_two(), loop)
    for _ in range(5):
        assert len(s.take(4, 0).ids) == 4
    assert len(loop.wakes) == 1
    s._look()  # the fetcher looked (its request is in flight): a later need wakes it again
    s.take(4, 0)
    assert len(loop.wakes) == 2


def test_a_finished_shard_wakes_the_fetcher_even_after_a_wake() -> None:
    """The wake already on its way covers it: the fetcher reads the synced refs too."""
    loop = RecordingLoop()
    s = stream(holding_one_of_two(), loop)
    taken = s.take(100, 0)
    assert len(taken.finished) == 1 and len(loop.wakes) == 1
    s.synced(taken.finished)
    assert len(loop.wakes) == 1  # not looked at yet: the first wake brings it there
    fetch, _ = s._look()
    assert fetch is not None and fetch.done == tuple(taken.finished)
    s.synced(Taken().finished)  # nothing finished: no wake
    assert len(loop.wakes) == 1
