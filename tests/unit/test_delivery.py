"""delivery.py: a subscription's messages straight to a synchronous taker while nothing
waits ahead of them, in order through the queue otherwise; handler slots; a concurrent
subscription's two ways in."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from antdt.runtime.bus import delivery


@dataclass
class FakeMsg:
    data: bytes


class FakeSub:
    """What delivery.install needs of a nats-py Subscription: its pending queue and byte
    count, and the delivery task that empties the queue into `cb`."""

    def __init__(self, cb: Any) -> None:
        self._cb = cb
        self._pending_queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=100)
        self._pending_size = 0
        self._wait_for_msgs_task: asyncio.Task[None] | None = (
            asyncio.get_running_loop().create_task(self._wait_for_msgs(None))
        )

    def receive(self, msg: FakeMsg) -> None:
        """As nats-py's client does with a message read from the socket."""
        self._pending_size += len(msg.data)
        self._pending_queue.put_nowait(msg)

    async def _wait_for_msgs(self, error_cb: Any) -> None:
        while True:
            msg = await self._pending_queue.get()
            self._pending_size -= len(msg.data)
            await self._cb(msg)
            self._pending_queue.task_done()


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_messages_go_straight_to_the_taker_and_leave_nothing_pending() -> None:
    taken: list[bytes] = []

    async def queued(msg: FakeMsg) -> None:
        raise AssertionError("nothing should reach the queue")

    sub = FakeSub(queued)
    assert delivery.install(sub, lambda m: taken.append(m.data) is None)
    for i in range(5):
        sub.receive(FakeMsg(b"m%d" % i))
    assert taken == [b"m0", b"m1", b"m2", b"m3", b"m4"]  # at once, no loop turn
    assert sub._pending_size == 0 and sub._pending_queue.empty()
    put = delivery.direct_put(sub)
    assert put is not None and put.taken == 5


async def test_a_declined_message_and_all_after_it_go_through_the_queue_in_order() -> None:
    order: list[str] = []
    accepting = True

    def take(msg: FakeMsg) -> bool:
        if accepting:
            order.append("direct " + msg.data.decode())
        return accepting

    async def queued(msg: FakeMsg) -> None:
        order.append("queued " + msg.data.decode())

    sub = FakeSub(queued)
    assert delivery.install(sub, take)
    sub.receive(FakeMsg(b"1"))
    accepting = False
    sub.receive(FakeMsg(b"2"))
    accepting = True  # the taker would take again, but 2 waits in the queue: 3 goes behind it
    sub.receive(FakeMsg(b"3"))
    assert order == ["direct 1"]
    await settle()  # the subscription's own task empties the queue, as ever
    assert order == ["direct 1", "queued 2", "queued 3"]
    sub.receive(FakeMsg(b"4"))  # the queue is empty again: straight to the taker
    assert order[-1] == "direct 4" and sub._pending_size == 0
    await sub._pending_queue.join()  # a drain's wait ends: nothing is left unfinished


async def test_install_leaves_a_subscription_it_does_not_know() -> None:
    class Other:  # another nats-py: none of the internals
        pass

    other = Other()
    assert not delivery.install(other, lambda m: True)
    assert delivery.direct_put(other) is None


async def test_a_taker_that_raises_drops_the_message_and_the_read_goes_on() -> None:
    """Raised inside nats-py's read loop, it would stop the connection's reading."""

    def take(msg: FakeMsg) -> bool:
        if msg.data == b"bad":
            raise ValueError("a bug in the handler's first step")
        return True

    async def queued(msg: FakeMsg) -> None:
        raise AssertionError("nothing should reach the queue")

    sub = FakeSub(queued)
    assert delivery.install(sub, take)
    sub.receive(FakeMsg(b"bad"))  # does not raise
    sub.receive(FakeMsg(b"good"))
    put = delivery.direct_put(sub)
    assert put is not None and (put.taken, put.failed) == (2, 1) and sub._pending_size == 0


async def test_slots_are_taken_at_once_while_free_then_handed_out_in_turn() -> None:
    slots = delivery.Slots(2)
    assert slots.take_now() and slots.take_now()
    assert not slots.take_now()
    got: list[str] = []

    async def wait(name: str) -> None:
        await slots.take()
        got.append(name)

    first = asyncio.ensure_future(wait("first"))
    second = asyncio.ensure_future(wait("second"))
    await settle()
    assert got == []
    slots.give()
    await settle()
    assert got == ["first"]
    assert not slots.take_now()  # one still waits: nobody takes ahead of it
    slots.give()
    await settle()
    assert got == ["first", "second"] and first.done() and second.done()


async def test_a_cancelled_waiter_gives_up_its_place_and_never_keeps_a_slot() -> None:
    slots = delivery.Slots(1)
    assert slots.take_now()
    waiter = asyncio.ensure_future(slots.take())
    await settle()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    slots.give()
    assert slots.take_now()  # the slot came back: the cancelled waiter is gone
    # Handed the slot in the same turn as it was cancelled: it passes the slot on.
    waiter = asyncio.ensure_future(slots.take())
    await settle()
    slots.give()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert slots.take_now()


async def test_a_message_read_while_a_queued_one_is_handed_a_slot_waits_behind_it() -> None:
    """Two handlers hold both slots; message 2 is queued and waits for one. Both end in
    one pass of the loop: the first slot goes to 2's waiter, the second is free. Message
    3, read before 2's task runs again, must not start ahead of it."""
    order: list[bytes] = []
    gate = asyncio.Event()
    handling: set[asyncio.Task[None]] = set()

    async def on_msg(msg: FakeMsg) -> None:
        order.append(msg.data)
        if msg.data in (b"1a", b"1b"):
            await gate.wait()

    take, start = delivery.concurrently(on_msg, 2, lambda: False, handling)
    sub = FakeSub(start)
    assert delivery.install(sub, take)
    sub.receive(FakeMsg(b"1a"))
    sub.receive(FakeMsg(b"1b"))
    sub.receive(FakeMsg(b"2"))  # no slot: queued, and its task waits for one
    await settle()
    assert order == [b"1a", b"1b"] and len(handling) == 2
    gate.set()
    while handling:
        await asyncio.sleep(0)  # until both handlers ended and released their slots
    assert order == [b"1a", b"1b"]  # 2's task has not run again yet
    sub.receive(FakeMsg(b"3"))
    await settle()
    assert order == [b"1a", b"1b", b"2", b"3"]
    assert not handling
