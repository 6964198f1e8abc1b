"""How a subscription's messages reach their handler: straight from nats-py's read of the
socket, through a synchronous `take(msg)`, while nothing waits in the subscription's queue;
a declined message, and every one after it until the queue is empty, takes the queue (order
kept). A taker must not raise (caught and counted here), and a handler it starts must not
enter `asyncio.timeout()` before its first wait: its first step runs in the read loop's task."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from antdt.runtime.bus import eager

log = structlog.get_logger("antdt.bus")

#: A synchronous handler: True if it took the message, False to leave it to the queue.
Take = Callable[[Any], bool]


class DirectPut:
    """Stands in for a subscription queue's `put_nowait`: hands each message to `take`
    when nothing waits in the queue ahead of it."""

    def __init__(self, sub: Any, queue: asyncio.Queue[Any], take: Take) -> None:
        self._sub = sub
        self._queue = queue
        self._take = take
        self.taken = 0  # messages handed over directly (tests and diagnostics)
        self.failed = 0  # messages whose taker raised

    def __call__(self, item: Any) -> None:
        queue = self._queue
        if queue.empty():
            try:
                taken = self._take(item)
            except Exception:
                self.failed += 1
                taken = True  # dropped, as a failing handler's message is
                log.exception("message handler failed", subject=getattr(item, "subject", ""))
            if taken:
                # nats-py counted the message's bytes as pending, for the queue to uncount.
                self._sub._pending_size -= len(item.data)
                self.taken += 1
                return
        asyncio.Queue.put_nowait(queue, item)


def install(sub: Any, take: Take) -> bool:
    """Give the callback subscription `sub` direct delivery through `take`. False: left
    as it was (nats-py's internals are not the ones this knows)."""
    queue = getattr(sub, "_pending_queue", None)
    if not isinstance(queue, asyncio.Queue) or not isinstance(
        getattr(sub, "_pending_size", None), int
    ):
        log.warning("nats-py's subscription internals differ: messages take its queue")
        return False
    # The queue stays, and so does the task that empties it: only the way in changes.
    queue.put_nowait = DirectPut(sub, queue, take)  # type: ignore[method-assign]
    return True


def direct_put(sub: Any) -> DirectPut | None:
    """`sub`'s direct delivery; None if it has none."""
    put = getattr(getattr(sub, "_pending_queue", None), "put_nowait", None)
    return put if isinstance(put, DirectPut) else None


class Slots:
    """At most `count` handlers at once: a slot is taken at once when one is free and
    nobody waits (`take_now`), or waited for in turn (`take`); `give` hands it back."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    def take_now(self) -> bool:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        if self.take_now():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a slot just as it was cancelled: pass it on
            elif waiter in self._waiting:
                self._waiting.remove(waiter)
            raise

    def give(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot goes to the first waiting
                return
        self._free += 1


Handle = Callable[[Any], Coroutine[Any, Any, None]]


def concurrently(
    on_msg: Handle, count: int, turn_due: Callable[[], bool], handling: set[asyncio.Task[None]]
) -> tuple[Take, Handle]:
    """A subscription's two ways into `on_msg`, at most `count` at once, each handled eagerly
    (eager.py), in arrival order: `take`, from the read of the socket (declines when no slot
    is free, a queued message waits for one, or `turn_due()`), and `start`, from the queue
    (waits for a slot, gives the loop its turns). Running tasks are in `handling` (drain)."""
    slots = Slots(count)
    queued_waiting = 0  # messages from the queue waiting for a slot: none may be passed

    def release(task: asyncio.Task[None]) -> None:
        handling.discard(task)
        slots.give()

    def begin(msg: Any) -> None:
        """Handle `msg` up to its first wait, holding a slot taken for it."""
        try:
            task = eager.start(on_msg(msg))
        except asyncio.CancelledError:  # raised by the handler itself: as its task would,
            slots.give()  # it ends there, and the delivery goes on
            return
        except BaseException:  # KeyboardInterrupt, SystemExit: as from a task
            slots.give()
            raise
        if task is None:  # handled without waiting: no task needed
            slots.give()
        else:
            handling.add(task)
            task.add_done_callback(release)

    def take(msg: Any) -> bool:
        # A slot handed to a queued message's waiter is not taken until that waiter
        # runs: a message read meanwhile must not start ahead of it.
        if queued_waiting or turn_due() or not slots.take_now():
            return False
        begin(msg)
        return True

    async def start(msg: Any) -> None:
        nonlocal queued_waiting
        queued_waiting += 1
        try:
            await slots.take()
        finally:
            queued_waiting -= 1
        begin(msg)
        if turn_due():
            await asyncio.sleep(0)

    return take, start
