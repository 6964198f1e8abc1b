"""A subscription `Bus.subscribe` made, and when its delivery loop yields the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import time

from nats.aio.subscription import Subscription as NatsSubscription

#: How long a subscription's delivery loop may hold the event loop, seconds (about).
TURN_AFTER_S = 0.02
#: Messages handed out between two looks at the clock.
CHECK_EVERY = 16


class Subscription:
    """A subscription made by `Bus.subscribe`, to end on its own before the connection."""

    def __init__(self, sub: NatsSubscription, subs: list[NatsSubscription]) -> None:
        self._sub = sub
        self._subs = subs  # the connection's, which its drain goes over
        self._ending: asyncio.Task[None] | None = None

    @property
    def ended(self) -> bool:
        return self._ending is not None

    @property
    def pending(self) -> tuple[int, int]:
        """Messages received and waiting for the handler: (how many, bytes)."""
        return int(self._sub.pending_msgs), int(self._sub.pending_bytes)

    def limit_pending(self, max_bytes: int) -> None:
        """Cap what may wait for the handler, bytes, from now on: past it each message
        is dropped and counted (code slow_consumer). What waits already stays."""
        self._sub._pending_bytes_limit = max(1, max_bytes)  # (0 would be: no cap)

    def end(self) -> asyncio.Task[None] | None:
        """Stop receiving: UNSUB at once; what is queued still reaches the handler, then
        the delivery loop ends. Returns at once (the subscription's own handler may call
        it), with the task that finishes it; None if it was ended already."""
        if self._ending is not None:
            return None
        with contextlib.suppress(ValueError):
            self._subs.remove(self._sub)
        self._ending = asyncio.get_running_loop().create_task(_end(self._sub))
        return self._ending


class Turns:
    """When a subscription's delivery loop should give the event loop a turn: once it has
    held the loop for TURN_AFTER_S. nats-py gives none while the subscription's queue
    holds messages; by time, not by count, since each turn also reads the socket."""

    __slots__ = ("_last", "_since")

    def __init__(self) -> None:
        self._since = 0
        self._last = time.monotonic()

    def due(self) -> bool:
        self._since += 1
        if self._since < CHECK_EVERY:  # the clock only every few messages
            return False
        self._since = 0
        now = time.monotonic()
        if now - self._last < TURN_AFTER_S:
            return False
        self._last = now
        return True


async def drain(sub: NatsSubscription) -> None:
    with contextlib.suppress(Exception):  # closed already, or the connection is away
        await sub.drain()


async def _end(sub: NatsSubscription) -> None:
    try:
        await sub.drain()
    except Exception:
        # The connection is away or closing: drop the interest without the drain, so that
        # a reconnect does not subscribe again.
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
