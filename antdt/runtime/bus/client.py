"""`Bus`: typed publish, subscribe and request over wire models on one NATS connection,
validated at the boundary (each rejection counted, answered with ErrorReply when a reply
is expected), trace context in headers, endless reconnects. JetStream is `bus.jetstream`."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.errors import MaxPayloadError, SlowConsumerError
from nats.errors import TimeoutError as NatsTimeoutError
from opentelemetry import context as otel_context
from opentelemetry import propagate
from pydantic import BaseModel, TypeAdapter

from antdt.runtime.bus import delivery
from antdt.runtime.bus.connecting import first_connection, permissions_violation
from antdt.runtime.bus.inbox import NO_RESPONDERS, STATUS_HEADER, Inbox
from antdt.runtime.bus.jetstream import JetStream
from antdt.runtime.bus.messages import (
    BusError,
    Decoder,
    Delivery,
    Handler,
    Rejected,
    Rejections,
    RequestRefused,
    decode_reply,
    deflated,
    encode,
    reply_headers,
    trace_headers,
)
from antdt.runtime.bus.subscription import Subscription, Turns, drain
from antdt.runtime.config import NatsSettings
from antdt.schemas import ErrorCode, ErrorReply

M = TypeVar("M")
R = TypeVar("R", bound=BaseModel)
log = structlog.get_logger("antdt.bus")


class Bus:
    """One NATS connection with typed helpers. Reconnects forever; buffers while away."""

    def __init__(
        self, settings: NatsSettings, *, name: str, rejections: Rejections | None = None
    ) -> None:
        """`rejections`: counts to share with another connection of the same service."""
        self.settings = settings
        self.name = name
        self.rejections = rejections if rejections is not None else Rejections()
        self.jetstream = JetStream(lambda: self.nc, self.rejections, settings.stream_replicas)
        self.handler_errors = 0
        self._nc: NatsClient | None = None
        self._subs: list[NatsSubscription] = []
        self._handling: set[asyncio.Task[None]] = set()  # of subscriptions with concurrency
        self._inbox: Inbox | None = None  # replies to this connection's requests
        #: nats-server's refusals of publishes and subscriptions (its role's permissions)
        self.refused: collections.deque[str] = collections.deque(maxlen=100)

    # -- connection ---------------------------------------------------------------

    async def connect(self, *, retry_for_s: float | None = 30.0) -> Bus:
        """Connect, retrying the first connection with backoff for up to `retry_for_s`
        seconds (None: as long as it takes, saying so now and then); after that the
        connection reconnects forever on its own. A server that refuses this client
        (credentials, certificates) fails it at once: retrying would not help."""
        self._nc = await first_connection(
            self.settings,
            self.name,
            retry_for_s,
            error_cb=self._on_error,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
        )
        return self

    async def _on_error(self, exc: Exception) -> None:
        if isinstance(exc, SlowConsumerError):
            # nats-py dropped a message: its subscription's queue was full (a handler far
            # behind). One call per message, so counted, and logged the first time, as any
            # rejection (and exported with them), never formatted per message.
            pattern = exc.sub.subject if exc.sub is not None else exc.subject
            self.rejections.record(pattern, ErrorCode.SLOW_CONSUMER, SLOW_CONSUMER, exc.subject)
            return
        if permissions_violation(exc):
            self.refused.append(str(exc))
            log.error(
                "nats-server refused", error=str(exc), client=self.name, user=self.settings.user
            )
            return
        log.debug("nats error", error=str(exc), client=self.name)

    async def _on_disconnected(self) -> None:
        log.info("nats disconnected", client=self.name)

    async def _on_reconnected(self) -> None:
        log.info("nats reconnected", client=self.name)

    def delivered_directly(self) -> int:
        """Messages this connection's subscriptions took straight from the read of the
        socket (delivery.py): its requests' replies, and what subscriptions with
        concurrency handled while they kept up."""
        subs = [*self._subs, *([self._inbox.sub] if self._inbox and self._inbox.sub else [])]
        return sum(put.taken for sub in subs if (put := delivery.direct_put(sub)) is not None)

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    @property
    def nc(self) -> NatsClient:
        if self._nc is None:
            raise BusError("bus not connected")
        return self._nc

    async def drain(self, before_close: Callable[[], Awaitable[None]] | None = None) -> None:
        """Stop taking new messages, let in-flight handlers finish, flush, close.

        `before_close`: what the handlers left to send (a publisher's queue), awaited
        (at most 5 s) once they have finished and while the connection is still open."""
        if self._nc is None or self._nc.is_closed:
            return
        # Each subscription first (it waits for its queued messages to reach a handler),
        # then the handlers that run as tasks (concurrency > 1): their replies need the
        # connection, which the connection's own drain closes.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*(drain(sub) for sub in self._subs)), timeout=5)
        if self._handling:
            await asyncio.wait(set(self._handling), timeout=5)
        if before_close is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(before_close(), timeout=5)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._nc.drain(), timeout=5)
        with contextlib.suppress(Exception):
            await self._nc.close()

    async def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(Exception):
                await self._nc.close()

    async def flush(self, timeout: float = 2.0) -> None:
        """Return once nats-server has read everything sent so far (SUBs and PUBs).
        nats-py's own flush pings ahead of the commands its flusher task still holds:
        hand those to the flusher first, then ping."""
        nc = self.nc
        await asyncio.wait_for(nc._flush_pending(force_flush=True), timeout)
        if not nc.is_connected:  # (nats-py's flush returns quietly once its writer is gone)
            raise BusError("not connected to nats-server: nothing confirmed")
        await self._ping(timeout)

    async def rtt(self, timeout: float = 2.0) -> float:
        """Seconds of one PING/PONG with nats-server: the round trip over this
        connection's link, behind whatever it is still sending. BusError when away."""
        if not self.nc.is_connected:
            raise BusError("not connected to nats-server: no round trip")
        return await self._ping(timeout)

    async def _ping(self, timeout: float) -> float:
        """One PING, its PONG awaited up to `timeout` (else BusError); the round trip.
        The PING's future is never cancelled: nats-py (2.16) resolves a late PONG's
        future unchecked, and the InvalidStateError ends its read loop, leaving a
        connection that reads nothing and never notices. A late PONG resolves it."""
        loop = asyncio.get_running_loop()
        pong: asyncio.Future[bool] = loop.create_future()
        start = loop.time()
        await self.nc._send_ping(pong)
        done, _ = await asyncio.wait({pong}, timeout=timeout)
        if not done:
            raise BusError(f"no PONG from nats-server within {timeout}s")
        return loop.time() - start

    # -- publish / request -------------------------------------------------------

    trace_headers = staticmethod(trace_headers)

    async def publish(
        self, subject: str, model: BaseModel, headers: Mapping[str, str] | None = None
    ) -> None:
        """`model` on `subject`, gzipped over COMPRESS_OVER_BYTES (`deflated`). BusError
        when even so it is over the server's max_payload: the caller learns the size."""
        data, coding = deflated(encode(model))
        extra = {**headers, **coding} if headers and coding else headers or coding
        try:
            await self.nc.publish(subject, data, headers=self.trace_headers(extra) or None)
        except MaxPayloadError:
            raise BusError(
                f"{type(model).__name__} of {len(data)} bytes on {subject} is over "
                f"nats-server's max_payload ({self.nc.max_payload} bytes)"
            ) from None

    async def publish_raw(self, subject: str, data: bytes) -> None:
        """Untyped bytes, for tests of bad input and for benchmarks."""
        await self.nc.publish(subject, data)

    async def request(
        self,
        subject: str,
        model: BaseModel,
        reply_type: type[R],
        *,
        timeout: float | None = None,
    ) -> R:
        """Request/reply; raises RequestRefused on an ErrorReply, BusError otherwise. The
        request is gzipped over COMPRESS_OVER_BYTES, as `publish` does."""
        data, coding = deflated(encode(model))
        return self._reply(await self._request_msg(subject, data, timeout, coding), reply_type)

    async def request_bytes(
        self, subject: str, data: bytes, reply_type: type[R], *, timeout: float | None = None
    ) -> R:
        """`request` with a payload already encoded (or deliberately malformed, in tests)."""
        return self._reply(await self._request_msg(subject, data, timeout), reply_type)

    def _reply(self, msg: Msg, reply_type: type[R]) -> R:
        strict = self.settings.require_reply_type
        return decode_reply(bytes(msg.data), reply_type, msg.headers, require_type=strict)

    async def request_raw(
        self, subject: str, data: bytes, *, timeout: float | None = None
    ) -> bytes:
        """Untyped bytes in and out, for tests of bad input and for benchmarks."""
        return bytes((await self._request_msg(subject, data, timeout)).data)

    async def _request_msg(
        self,
        subject: str,
        data: bytes,
        timeout: float | None,
        coding: Mapping[str, str] | None = None,
    ) -> Msg:
        if self._inbox is None:
            self._inbox = Inbox(self.nc)
        try:
            msg = await self._inbox.request(
                subject,
                data,
                timeout=timeout or self.settings.request_timeout_s,
                headers=self.trace_headers(coding) or None,
            )
        except NatsTimeoutError:
            raise BusError(f"request on {subject} timed out") from None
        if msg.headers and msg.headers.get(STATUS_HEADER) == NO_RESPONDERS:
            raise BusError(f"no responder on {subject}")
        return msg

    async def gather(
        self,
        subject: str,
        model: BaseModel,
        reply_type: type[R],
        *,
        timeout: float,
        done: Callable[[list[R | ErrorReply]], bool] | None = None,
    ) -> list[R | ErrorReply]:
        """Publish once and collect every responder's reply (all ranks on a broadcast
        subject) until `done(replies)` holds or `timeout` passes. An ErrorReply is kept as
        such; a reply that is neither is counted (pattern `gather`) and skipped."""
        inbox = self.nc.new_inbox()
        queue: asyncio.Queue[Msg] = asyncio.Queue()
        strict = self.settings.require_reply_type

        async def on_reply(msg: Msg) -> None:
            queue.put_nowait(msg)

        sub = await self.nc.subscribe(inbox, cb=on_reply)
        replies: list[R | ErrorReply] = []
        try:
            data, coding = deflated(encode(model))
            headers = self.trace_headers(coding) or None
            await self.nc.publish(subject, data, reply=inbox, headers=headers)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while done is None or not done(replies):
                try:
                    msg = await asyncio.wait_for(queue.get(), deadline - loop.time())
                except (TimeoutError, asyncio.TimeoutError):
                    break
                try:
                    data, headers = bytes(msg.data), msg.headers
                    replies.append(decode_reply(data, reply_type, headers, require_type=strict))
                except RequestRefused as exc:
                    replies.append(exc.reply)
                except BusError as exc:
                    self.rejections.record("gather", ErrorCode.BAD_REPLY, str(exc), subject)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return replies

    # -- subscribe -----------------------------------------------------------------

    async def subscribe(
        self,
        subject: str,
        target: type[M] | TypeAdapter[M],
        handler: Handler[M],
        *,
        queue: str = "",
        pending_msgs: int = 500_000,
        pending_bytes: int = 512 * 1024 * 1024,
        concurrency: int = 1,
    ) -> Subscription:
        """Validate every message into `target`, then call `handler(model, delivery)`; its
        returned model is the reply. Bad input and handler failures are counted and
        answered with ErrorReply; they never escape. Past `pending_msgs` or `pending_bytes`
        waiting, messages are dropped and counted (slow_consumer). `concurrency` > 1: up
        to that many handled at once, each eagerly up to its first wait (eager.py,
        delivery.py), for handlers that wait on something shared."""
        # A partial, not a closure that awaits _dispatch: one coroutine less per message.
        # The loop's turns are given where the subscription's delivery loop waits: in
        # _dispatch, or in the wrapper that starts each message's handler.
        turns = Turns()
        on_msg: Callable[[Msg], Coroutine[Any, Any, None]] = functools.partial(
            self._dispatch, subject, Decoder(target), handler, turns if concurrency == 1 else None
        )
        take: delivery.Take | None = None
        if concurrency > 1:
            take, on_msg = delivery.concurrently(on_msg, concurrency, turns.due, self._handling)
        sub = await self.nc.subscribe(
            subject,
            queue=queue,
            cb=on_msg,
            pending_msgs_limit=pending_msgs,
            pending_bytes_limit=pending_bytes,
        )
        if take is not None:
            delivery.install(sub, take)
        self._subs.append(sub)
        handle = Subscription(sub, self._subs)
        # The server knows the subscription only once it has read our SUB: flush, so that
        # "subscribed" means "will receive what is published from now on". Away from the
        # server (reconnecting), the SUB goes out when the connection is back: say so
        # rather than fail the caller, for messages published until then are not seen.
        try:
            await self.flush(timeout=2)
        except Exception as exc:
            log.warning(
                "subscription not confirmed by nats-server yet", subject=subject, error=repr(exc)
            )
        return handle

    async def _dispatch(
        self,
        pattern: str,
        decoder: Decoder[M],
        handler: Handler[M],
        turns: Turns | None,
        msg: Msg,
    ) -> None:
        token = None
        try:  # headers too: a handler may run inside nats-py's read loop (delivery.py)
            headers = dict(msg.headers) if msg.headers else {}
            meta = Delivery(msg.subject, headers, msg.reply or "")  # positional: cheaper
            token = otel_context.attach(propagate.extract(headers)) if headers else None
            model = decoder.decode(msg.data, headers)
            reply = await handler(model, meta)
        except Rejected as exc:
            self.rejections.record(pattern, exc.code, exc.reason, msg.subject)
            reply = ErrorReply(error=exc.reason[:2000], code=exc.code)
        except Exception as exc:  # a handler bug must not kill the subscription
            self.handler_errors += 1
            log.exception("handler failed", subject=msg.subject)
            reply = ErrorReply(
                error=f"internal error: {type(exc).__name__}", code=ErrorCode.INTERNAL
            )
        finally:
            if token is not None:
                otel_context.detach(token)
        if msg.reply and reply is not None:
            await self._respond(msg, reply)
        if turns is not None and turns.due():
            await asyncio.sleep(0)

    async def _respond(self, msg: Msg, reply: BaseModel) -> None:
        """Send `reply` to `msg`'s requester with the request's headers (trace context)
        echoed, as msg.respond would, and the reply's type: a requester tells an
        ErrorReply from its answer by it. A reply over the server's max_payload goes as
        a TOO_LARGE ErrorReply (the requester learns why, not a timeout); one that
        cannot be sent (connection gone) is logged."""
        data = encode(reply)
        if len(data) > self.nc.max_payload:
            log.warning(
                "reply over max_payload; refused instead",
                subject=msg.subject,
                reply=type(reply).__name__,
                bytes=len(data),
            )
            reply = ErrorReply(
                error=f"{type(reply).__name__} reply of {len(data)} bytes is over "
                f"nats-server's max_payload ({self.nc.max_payload} bytes)",
                code=ErrorCode.TOO_LARGE,
            )
            data = encode(reply)
        try:
            await self.nc.publish(msg.reply, data, headers=reply_headers(msg.headers, reply))
        except Exception as exc:
            log.warning("reply not sent", subject=msg.subject, error=repr(exc))


#: The reason a message nats-py dropped behind a full subscription queue is counted with.
SLOW_CONSUMER = "the subscription's queue was full (its handler far behind): message dropped"
