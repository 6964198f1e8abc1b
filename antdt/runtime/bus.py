"""The NATS seam: the only module that imports nats.

Typed publish/subscribe/request over pydantic wire models, validation at the boundary
(every rejection counted, logged once per reason, answered with ErrorReply when a reply
is expected), W3C trace context in headers, reconnects, JetStream streams."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

import nats
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import NotFoundError
from opentelemetry import context as otel_context
from opentelemetry import propagate
from pydantic import BaseModel, TypeAdapter, ValidationError

from antdt.runtime.config import NatsSettings
from antdt.schemas import MAX_MESSAGE_BYTES, ErrorReply, WireModel

M = TypeVar("M")
R = TypeVar("R", bound=BaseModel)
log = structlog.get_logger("antdt.bus")


class BusError(RuntimeError):
    """The bus could not deliver (not connected, no responder, timeout)."""


class RequestRefused(BusError):
    """The responder answered with an ErrorReply."""

    def __init__(self, reply: ErrorReply) -> None:
        super().__init__(f"{reply.code}: {reply.error}")
        self.reply = reply


class StreamMissing(BusError):
    """The JetStream stream does not exist (nobody ensured it)."""


class Rejected(ValueError):
    """Raised by a handler to refuse a message with a machine code and a clear reason."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass
class Replay(Generic[M]):
    """What a bounded read of a stream returned (`Bus.js_read`)."""

    items: list[M]
    available: int  # messages matching the filter when the read began
    rejected: int = 0  # stored messages that failed validation (skipped)

    @property
    def truncated(self) -> bool:
        """True when the limit (or the stream's retention, mid-read) cut the read short."""
        return len(self.items) + self.rejected < self.available


class Delivery(NamedTuple):
    """What a handler learns about a message besides its payload.

    Immutable; a NamedTuple because one is built per message and a frozen dataclass
    costs several times more to build."""

    subject: str
    headers: Mapping[str, str]
    reply: str


Handler = Callable[[M, Delivery], Awaitable[BaseModel | None]]


class Decoder(Generic[M]):
    """Bytes → validated model (a model class or a TypeAdapter for unions)."""

    def __init__(self, target: type[M] | TypeAdapter[M]) -> None:
        self._adapter: TypeAdapter[M] = (
            target if isinstance(target, TypeAdapter) else TypeAdapter(target)
        )
        # The core validator's own method: TypeAdapter.validate_json only forwards to it,
        # and that Python-level hop is a tenth of a decode on a busy subscription.
        self._validate_json: Callable[[bytes], M] = self._adapter.validator.validate_json

    def decode(self, data: bytes) -> M:
        if len(data) > MAX_MESSAGE_BYTES:
            raise Rejected("too_large", f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
        try:
            return self._validate_json(data)
        except ValidationError as exc:
            raise Rejected("bad_request", _short_validation_error(exc)) from None


def _short_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "message"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def encode(model: BaseModel) -> bytes:
    return model.model_dump_json().encode()


class Rejections:
    """Counts rejected messages by (subscription, code); logs each reason the first time."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def record(self, pattern: str, code: str, reason: str, subject: str) -> None:
        key = (pattern, code)
        self.counts[key] += 1
        if self.counts[key] == 1:
            log.warning("message rejected", subject=subject, code=code, reason=reason)

    def total(self, pattern: str | None = None) -> int:
        return sum(n for (p, _), n in self.counts.items() if pattern is None or p == pattern)


class Bus:
    """One NATS connection with typed helpers. Reconnects forever; buffers while away."""

    def __init__(self, settings: NatsSettings, *, name: str) -> None:
        self.settings = settings
        self.name = name
        self.rejections = Rejections()
        self.handler_errors = 0
        self._nc: NatsClient | None = None
        self._subs: list[NatsSubscription] = []

    # -- connection ---------------------------------------------------------------

    async def connect(self, *, retry_for_s: float = 30.0) -> Bus:
        """Connect, retrying the first connection for up to `retry_for_s` seconds; after
        that the connection reconnects forever on its own."""
        deadline = asyncio.get_running_loop().time() + retry_for_s
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise BusError(f"cannot connect to NATS at {self.settings.url} in {retry_for_s}s")
            # nats-py retries an unreachable first server forever (reconnects are on) and
            # may swallow a cancel while doing so: only call it once a server answers TCP,
            # and bound it with asyncio.wait, which returns even if the task lingers.
            if not await self._any_server_reachable(min(remaining, 1.0)):
                await asyncio.sleep(min(self.settings.reconnect_wait_s, max(remaining, 0)))
                continue
            task = asyncio.ensure_future(self._nats_connect())
            done, _ = await asyncio.wait({task}, timeout=remaining)
            if task in done and task.exception() is None:
                self._nc = task.result()
                return self
            if task not in done:
                task.cancel()
            else:
                log.debug("nats connect failed; retrying", error=str(task.exception()))

    def _servers(self) -> list[str]:
        return [u.strip() for u in self.settings.url.split(",") if u.strip()]

    async def _any_server_reachable(self, timeout: float) -> bool:
        for url in self._servers():
            host_port = url.split("://", 1)[-1].rsplit("@", 1)[-1]
            host, _, port = host_port.rpartition(":")
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(host or "127.0.0.1", int(port or 4222)), timeout
                )
            except (OSError, TimeoutError, asyncio.TimeoutError, ValueError):
                continue
            writer.close()
            return True
        return False

    async def _nats_connect(self) -> NatsClient:
        return await nats.connect(
            servers=self._servers(),
            name=self.name,
            connect_timeout=self.settings.connect_timeout_s,  # type: ignore[arg-type]
            reconnect_time_wait=self.settings.reconnect_wait_s,  # type: ignore[arg-type]
            max_reconnect_attempts=-1,
            allow_reconnect=True,
            pending_size=self.settings.max_pending_bytes,
            error_cb=self._on_error,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
        )

    async def _on_error(self, exc: Exception) -> None:
        log.debug("nats error", error=str(exc), client=self.name)

    async def _on_disconnected(self) -> None:
        log.info("nats disconnected", client=self.name)

    async def _on_reconnected(self) -> None:
        log.info("nats reconnected", client=self.name)

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    @property
    def nc(self) -> NatsClient:
        if self._nc is None:
            raise BusError("bus not connected")
        return self._nc

    async def drain(self) -> None:
        """Stop taking new messages, let in-flight handlers finish, flush, close."""
        if self._nc is None or self._nc.is_closed:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._nc.drain(), timeout=5)
        with contextlib.suppress(Exception):
            await self._nc.close()

    async def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(Exception):
                await self._nc.close()

    async def flush(self, timeout: float = 2.0) -> None:
        await self.nc.flush(timeout=timeout)  # type: ignore[arg-type]

    # -- publish / request -------------------------------------------------------

    @staticmethod
    def trace_headers(extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers: dict[str, str] = dict(extra or {})
        propagate.inject(headers)
        return headers

    async def publish(
        self, subject: str, model: BaseModel, headers: Mapping[str, str] | None = None
    ) -> None:
        await self.nc.publish(subject, encode(model), headers=self.trace_headers(headers) or None)

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
        """Request/reply; raises RequestRefused on an ErrorReply, BusError otherwise."""
        data = await self.request_raw(subject, encode(model), timeout=timeout)
        return decode_reply(data, reply_type)

    async def request_raw(
        self, subject: str, data: bytes, *, timeout: float | None = None
    ) -> bytes:
        try:
            msg = await self.nc.request(
                subject,
                data,
                timeout=timeout or self.settings.request_timeout_s,
                headers=self.trace_headers() or None,
            )
        except NoRespondersError:
            raise BusError(f"no responder on {subject}") from None
        except NatsTimeoutError:
            raise BusError(f"request on {subject} timed out") from None
        return bytes(msg.data)

    async def gather(
        self,
        subject: str,
        model: BaseModel,
        reply_type: type[R],
        *,
        timeout: float,
        done: Callable[[list[R | ErrorReply]], bool] | None = None,
    ) -> list[R | ErrorReply]:
        """Scatter-gather: publish once with a private reply inbox and collect the replies
        of every responder (e.g. all ranks on a broadcast subject) until `done(replies)`
        holds or `timeout` passes. An ErrorReply is kept as such; a reply that is neither
        is counted in `rejections` (pattern `gather`) and skipped."""
        inbox = self.nc.new_inbox()
        queue: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_reply(msg: Msg) -> None:
            queue.put_nowait(bytes(msg.data))

        sub = await self.nc.subscribe(inbox, cb=on_reply)
        replies: list[R | ErrorReply] = []
        try:
            headers = self.trace_headers() or None
            await self.nc.publish(subject, encode(model), reply=inbox, headers=headers)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while done is None or not done(replies):
                try:
                    data = await asyncio.wait_for(queue.get(), deadline - loop.time())
                except (TimeoutError, asyncio.TimeoutError):
                    break
                try:
                    replies.append(decode_reply(data, reply_type))
                except RequestRefused as exc:
                    replies.append(exc.reply)
                except BusError as exc:
                    self.rejections.record("gather", "bad_reply", str(exc), subject)
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
    ) -> None:
        """Validate every message into `target`, then call `handler(model, delivery)`.

        A handler's returned model is the reply (when the message expects one). Bad input
        and handler failures are counted and answered with ErrorReply; they never escape."""
        # A partial, not a closure that awaits _dispatch: one coroutine less per message.
        on_msg = functools.partial(self._dispatch, subject, Decoder(target), handler)
        sub = await self.nc.subscribe(
            subject,
            queue=queue,
            cb=on_msg,
            pending_msgs_limit=pending_msgs,
            pending_bytes_limit=512 * 1024 * 1024,
        )
        self._subs.append(sub)
        # The server knows the subscription only once it has read our SUB: flush, so that
        # "subscribed" means "will receive what is published from now on".
        with contextlib.suppress(Exception):
            await self.nc.flush(timeout=2)  # type: ignore[arg-type]

    async def _dispatch(
        self, pattern: str, decoder: Decoder[M], handler: Handler[M], msg: Msg
    ) -> None:
        headers = dict(msg.headers) if msg.headers else {}
        delivery = Delivery(msg.subject, headers, msg.reply or "")  # positional: cheaper
        token = otel_context.attach(propagate.extract(headers)) if headers else None
        try:
            model = decoder.decode(msg.data)
            reply = await handler(model, delivery)
        except Rejected as exc:
            self.rejections.record(pattern, exc.code, exc.reason, msg.subject)
            reply = ErrorReply(error=exc.reason[:2000], code=exc.code)
        except Exception as exc:  # a handler bug must not kill the subscription
            self.handler_errors += 1
            log.exception("handler failed", subject=msg.subject)
            reply = ErrorReply(error=f"internal error: {type(exc).__name__}", code="internal")
        finally:
            if token is not None:
                otel_context.detach(token)
        if msg.reply and reply is not None:
            with contextlib.suppress(Exception):
                await msg.respond(encode(reply))

    # -- JetStream -------------------------------------------------------------------

    async def ensure_stream(
        self,
        name: str,
        subjects: list[str],
        *,
        max_age_s: float = 7 * 86400,
        max_msgs: int = 1_000_000,
        max_bytes: int | None = None,
    ) -> None:
        """Create the stream, or update its subjects and limits (bounded retention).
        `max_bytes` (None: no size cap) drops the oldest messages past that size."""
        js = self.nc.jetstream()
        config = StreamConfig(
            name=name,
            subjects=subjects,
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=max_age_s,
            max_msgs=max_msgs,
        )
        if max_bytes is not None:
            config.max_bytes = max_bytes
        try:
            await js.stream_info(name)
            await js.update_stream(config)
        except NotFoundError:
            await js.add_stream(config)

    async def js_publish(
        self, subject: str, model: BaseModel, *, msg_id: str | None = None, timeout: float = 2.0
    ) -> int:
        """Publish to a stream and wait for its ack; returns the stream sequence.
        `msg_id` de-duplicates retries (Nats-Msg-Id)."""
        headers = self.trace_headers({"Nats-Msg-Id": msg_id} if msg_id else None)
        ack = await self.nc.jetstream().publish(
            subject, encode(model), timeout=timeout, headers=headers or None
        )
        return int(ack.seq)

    async def js_replay(
        self, stream: str, subject: str, target: type[M] | TypeAdapter[M], *, limit: int = 10_000
    ) -> list[M]:
        """Every valid message of `subject` still held in `stream`, oldest first."""
        js = self.nc.jetstream()
        decoder = Decoder(target)
        out: list[M] = []
        sub = await js.pull_subscribe(subject, stream=stream)
        try:
            while len(out) < limit:
                try:
                    msgs = await sub.fetch(batch=min(256, limit - len(out)), timeout=0.5)
                except NatsTimeoutError:
                    break
                for msg in msgs:
                    with contextlib.suppress(Rejected):
                        out.append(decoder.decode(msg.data))
                    await msg.ack()
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return out

    async def js_read(
        self,
        stream: str,
        subject: str,
        target: type[M] | TypeAdapter[M],
        *,
        limit: int = 100_000,
        batch: int = 512,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> Replay[M]:
        """The first `limit` messages of `subject` (a filter, wildcards allowed) held in
        `stream`, oldest first, without acks and without waiting for messages that are not
        there: it reads what matched when it began. `on_progress(read, total)` after each
        batch. Raises StreamMissing when the stream does not exist."""
        js = self.nc.jetstream()
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.ALL,
            inactive_threshold=30.0,
            mem_storage=True,
        )
        try:
            sub = await js.pull_subscribe(subject, stream=stream, config=config)
        except NotFoundError:
            raise StreamMissing(f"stream {stream} not found") from None
        replay: Replay[M] = Replay(items=[], available=0)
        consumer = ""
        try:
            info = await sub.consumer_info()
            consumer, replay.available = info.name or "", int(info.num_pending or 0)
            await self._read_pending(sub, Decoder(target), replay, limit, batch, on_progress)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            if consumer:  # else the server drops it after inactive_threshold
                with contextlib.suppress(Exception):
                    await js.delete_consumer(stream, consumer)
        return replay

    @staticmethod
    async def _read_pending(
        sub: Any,
        decoder: Decoder[M],
        replay: Replay[M],
        limit: int,
        batch: int,
        on_progress: Callable[[int, int], None] | None,
    ) -> None:
        wanted = min(replay.available, limit)
        read = 0
        while read < wanted:
            try:
                msgs = await sub.fetch(batch=min(batch, wanted - read), timeout=2.0)
            except NatsTimeoutError:
                break  # expired by retention while we read
            for msg in msgs:
                try:
                    replay.items.append(decoder.decode(msg.data))
                except Rejected:
                    replay.rejected += 1
            read += len(msgs)
            if on_progress is not None:
                on_progress(read, wanted)

    async def js_last(
        self, stream: str, subject: str, target: type[M] | TypeAdapter[M]
    ) -> M | None:
        """The newest message of one literal `subject` in `stream` (None: none, or invalid).
        Raises StreamMissing when the stream does not exist."""
        js = self.nc.jetstream()
        try:
            await js.stream_info(stream)
        except NotFoundError:
            raise StreamMissing(f"stream {stream} not found") from None
        try:
            raw = await js.get_last_msg(stream, subject)
        except NotFoundError:
            return None
        try:
            return Decoder(target).decode(raw.data or b"")
        except Rejected:
            return None

    async def js_durable(
        self,
        stream: str,
        subject: str,
        target: type[M] | TypeAdapter[M],
        *,
        durable: str,
        ack_wait_s: float = 30.0,
        max_deliver: int = 5,
        deliver_new: bool = False,
    ) -> DurableConsumer[M]:
        """A pull consumer of `subject` (a filter) in `stream` named `durable`, kept by the
        server across restarts of this process: binding the same name again resumes after
        the last acked message. Explicit acks; a message not acked within `ack_wait_s` is
        delivered again, at most `max_deliver` times. Starts at the stream's first message
        (`deliver_new`: at the next one) when the consumer is created. Raises StreamMissing
        when the stream does not exist."""
        js = self.nc.jetstream()
        config = ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait_s,
            max_deliver=max_deliver,
            deliver_policy=DeliverPolicy.NEW if deliver_new else DeliverPolicy.ALL,
            filter_subject=subject,
        )
        try:
            await js.stream_info(stream)
            sub = await js.pull_subscribe(subject, durable=durable, stream=stream, config=config)
        except NotFoundError:
            raise StreamMissing(f"stream {stream} not found") from None
        return DurableConsumer(sub, Decoder(target), f"{stream}/{durable}", self.rejections)


@dataclass
class Received(Generic[M]):
    """One message from a durable consumer. `ack()` once handled (else the server
    redelivers it after the consumer's ack wait), `nak()` to have it redelivered sooner,
    `term()` never to see it again."""

    model: M
    subject: str
    headers: Mapping[str, str]
    delivered: int  # deliveries so far, this one included (1: the first)
    msg: Any

    async def ack(self) -> None:
        await self.msg.ack()

    async def nak(self, delay_s: float | None = None) -> None:
        await self.msg.nak(delay=delay_s)

    async def term(self) -> None:
        await self.msg.term()


class DurableConsumer(Generic[M]):
    """A pull subscription bound to a durable JetStream consumer (`Bus.js_durable`)."""

    def __init__(self, sub: Any, decoder: Decoder[M], pattern: str, rejections: Rejections):
        self._sub = sub
        self._decoder = decoder
        self._pattern = pattern
        self._rejections = rejections

    async def fetch(self, batch: int = 16, *, timeout: float = 1.0) -> list[Received[M]]:
        """Up to `batch` messages, waiting at most `timeout` seconds for the first ([] when
        none came). Invalid messages are counted, terminated and left out."""
        try:
            msgs = await self._sub.fetch(batch=batch, timeout=timeout)
        except NatsTimeoutError:
            return []
        out: list[Received[M]] = []
        for msg in msgs:
            try:
                model = self._decoder.decode(msg.data)
            except Rejected as exc:
                self._rejections.record(self._pattern, exc.code, exc.reason, msg.subject)
                with contextlib.suppress(Exception):
                    await msg.term()
                continue
            delivered = int(msg.metadata.num_delivered or 1)
            out.append(Received(model, msg.subject, dict(msg.headers or {}), delivered, msg))
        return out

    async def close(self) -> None:
        """Stop pulling; the consumer (and its position) stays on the server."""
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()


_ERROR_FIELDS = set(ErrorReply.model_fields)


def decode_reply(data: bytes, reply_type: type[R]) -> R:
    """A reply is either `reply_type` or an ErrorReply (raised as RequestRefused)."""
    try:
        raw: Any = json.loads(data)
    except ValueError:
        raise BusError("reply is not JSON") from None
    is_error = isinstance(raw, dict) and {"error", "code"} <= set(raw) <= _ERROR_FIELDS
    if is_error and reply_type is not ErrorReply:
        raise RequestRefused(ErrorReply.model_validate(raw))
    try:
        return reply_type.model_validate(raw)
    except ValidationError as exc:
        raise BusError(f"bad reply: {_short_validation_error(exc)}") from None


__all__ = [
    "Bus",
    "BusError",
    "Decoder",
    "Delivery",
    "DurableConsumer",
    "Received",
    "Rejected",
    "Rejections",
    "Replay",
    "RequestRefused",
    "StreamMissing",
    "WireModel",
    "decode_reply",
    "encode",
]
