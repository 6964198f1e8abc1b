"""Request/reply over one wildcard subscription of the connection's own inbox."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.errors import TimeoutError as NatsTimeoutError

from antdt.runtime.bus import delivery

#: How nats-server says that nobody subscribes to a request's subject: a status message
#: to its reply subject (the connection announces headers, hence no_responders).
STATUS_HEADER, NO_RESPONDERS = "Status", "503"


class Inbox:
    """nats-py's `request`, leaner on the path of every shards fetch: a reply subject is
    the inbox and a counter (nothing random per request), the timeout one loop timer."""

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc
        self._prefix = nc.new_inbox() + "."
        self._count = 0
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        self._subscribing = asyncio.Lock()
        self.sub: NatsSubscription | None = None  # once subscribed

    async def request(
        self, subject: str, data: bytes, *, timeout: float, headers: dict[str, str] | None
    ) -> Msg:
        """The reply to `data` on `subject`; NatsTimeoutError after `timeout` seconds."""
        if self.sub is None:
            await self._subscribe()  # its SUB goes out before our PUB: no reply is missed
        self._count += 1
        token = str(self._count)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Msg] = loop.create_future()
        self._waiting[token] = future
        timer = loop.call_later(timeout, _expire, future)
        try:
            await self._nc.publish(subject, data, reply=self._prefix + token, headers=headers)
            return await future
        finally:
            timer.cancel()
            del self._waiting[token]

    async def _subscribe(self) -> None:
        async with self._subscribing:  # once, whoever asks first; again if that failed
            if self.sub is None:
                sub = await self._nc.subscribe(self._prefix + "*", cb=self._on_reply)
                delivery.install(sub, self._take)
                self.sub = sub

    def _take(self, msg: Msg) -> bool:
        future = self._waiting.get(msg.subject[len(self._prefix) :])
        if future is not None and not future.done():  # else: late, after its timeout
            future.set_result(msg)
        return True

    async def _on_reply(self, msg: Msg) -> None:  # without direct delivery (delivery.py)
        self._take(msg)


def _expire(future: asyncio.Future[Msg]) -> None:
    if not future.done():
        future.set_exception(NatsTimeoutError())
