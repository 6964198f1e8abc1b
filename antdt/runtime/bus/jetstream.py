"""The JetStream half of the NATS seam: bounded streams, de-duplicated publish, bounded
reads, the last message of a subject and durable consumers. A `Bus` holds one as
`bus.jetstream`, on its own connection."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog
from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import NoStreamResponseError, NotFoundError
from pydantic import BaseModel, TypeAdapter

from antdt.runtime.bus.messages import (
    BusError,
    Decoder,
    Rejected,
    Rejections,
    Replay,
    StreamMissing,
    StreamUnanswered,
    deflated,
    encode,
    sent_under,
    trace_headers,
)

M = TypeVar("M")
log = structlog.get_logger("antdt.bus")
#: How long an unanswered publish waits to learn whether its stream exists, seconds.
STREAM_LOOKUP_S = 1.0


def _unavailable(stream: str, exc: NatsError) -> BusError:
    """A read of `stream` nats-server did not serve (JetStream off or away: no responders,
    unavailable; a subject it refuses), as the bus's own error."""
    return BusError(f"{stream} not readable: {type(exc).__name__}: {exc}".rstrip(": "))


FETCH_TIMEOUT_S = 2.0  # one fetch of a bounded read waits at most this long
FETCH_ATTEMPTS = 3  # a bounded read ends after this many fetches in a row time out


class JetStream:
    """JetStream on a Bus's connection (`connection()` returns it, or raises while the Bus
    is not connected); rejected messages are counted in the Bus's `rejections`. Streams
    are kept on `replicas` servers of a cluster."""

    def __init__(
        self, connection: Callable[[], NatsClient], rejections: Rejections, replicas: int = 1
    ) -> None:
        self._connection = connection
        self.rejections = rejections
        self.replicas = replicas

    @property
    def nc(self) -> NatsClient:
        return self._connection()

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
            num_replicas=self.replicas,
        )
        if max_bytes is not None:
            config.max_bytes = max_bytes
        try:
            await js.stream_info(name)
            await js.update_stream(config)
        except NotFoundError:
            await js.add_stream(config)

    async def publish(
        self, subject: str, model: BaseModel, *, msg_id: str | None = None, timeout: float = 2.0
    ) -> int:
        """Publish to a stream and wait for its ack; returns the stream sequence.
        `msg_id` de-duplicates retries (Nats-Msg-Id). Gzipped over COMPRESS_OVER_BYTES (a
        large job's ActionRecord lists every rank's batch and ack), as `Bus.publish`."""
        data, coding = deflated(encode(model))
        headers = trace_headers({**coding, "Nats-Msg-Id": msg_id} if msg_id else coding)
        js = self.nc.jetstream()
        try:
            ack = await js.publish(subject, data, timeout=timeout, headers=headers or None)
        except (NoStreamResponseError, NatsTimeoutError):  # no leader: no reply, or none in time
            raise await self._unanswered(subject) from None
        return int(ack.seq)

    async def _unanswered(self, subject: str) -> BusError:
        """Why no stream answered a publish to `subject`: StreamMissing when no stream
        takes it, else StreamUnanswered (its replicas without a leader, for now)."""
        try:  # briefly: the publish waited its timeout already
            lookup = self.nc.jetstream().find_stream_name_by_subject(subject)
            stream = await asyncio.wait_for(lookup, STREAM_LOOKUP_S)
        except NotFoundError:
            return StreamMissing(f"no stream takes {subject}")
        except Exception:  # the cluster's own leader away too: a transient state
            stream = "its stream"
        return StreamUnanswered(f"{stream} did not answer a publish to {subject}")

    async def read(
        self,
        stream: str,
        subject: str,
        target: type[M] | TypeAdapter[M],
        *,
        limit: int = 100_000,
        batch: int = 512,
        on_progress: Callable[[int, int], None] | None = None,
        since: float | None = None,
    ) -> Replay[M]:
        """The first `limit` messages of `subject` (a filter, wildcards allowed) held in
        `stream`, oldest first, without acks and without waiting for messages that are not
        there: it reads what matched when it began. `since` (Unix seconds): only messages
        the server stored from then on. `on_progress(read, total)` after each batch.
        Raises StreamMissing when the stream does not exist."""
        js = self.nc.jetstream()
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.ALL,
            inactive_threshold=30.0,
            mem_storage=True,
        )
        if since is not None:
            config.deliver_policy = DeliverPolicy.BY_START_TIME
            config.opt_start_time = datetime.datetime.fromtimestamp(since, datetime.timezone.utc)
        try:
            sub = await js.pull_subscribe(subject, stream=stream, config=config)
        except NotFoundError:
            raise StreamMissing(f"stream {stream} not found") from None
        except NatsError as exc:  # JetStream off or away, a subject the server refuses
            raise _unavailable(stream, exc) from None
        replay: Replay[M] = Replay(items=[], available=0)
        consumer = ""
        try:
            info = await sub.consumer_info()
            consumer, replay.available = info.name or "", int(info.num_pending or 0)
            decoder = Decoder(target)

            def reject(exc: Rejected, msg: Any) -> None:  # counted and logged as a bus's are
                self.rejections.record(f"{stream}:read", exc.code, exc.reason, msg.subject)

            await self._read_pending(sub, decoder, replay, limit, batch, on_progress, reject)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            if consumer:  # else the server drops it after inactive_threshold
                with contextlib.suppress(Exception):
                    await js.delete_consumer(stream, consumer)
        return replay

    async def read_recent(
        self,
        stream: str,
        subject: str,
        target: type[M] | TypeAdapter[M],
        *,
        limit: int,
        lookbacks_s: tuple[float | None, ...],
        now: float,
    ) -> tuple[Replay[M], float | None]:
        """`read` of what `subject` holds while it is at most `limit` messages, else from
        each later start in turn (`lookbacks_s`: seconds before `now`, None: the first
        held), and the lookback read from: a bounded read whose newest messages, not
        its oldest, are the ones a reader must not miss. The replay may still be cut
        short (`truncated`) past the last lookback."""
        lookback: float | None = None
        for lookback in lookbacks_s:
            since = None if lookback is None else now - lookback
            replay = await self.read(stream, subject, target, limit=limit, since=since)
            if replay.available <= limit:
                break
            log.info(
                "more held than one read takes; reading later ones",
                subject=subject,
                held=replay.available,
                since=since,
            )
        return replay, lookback

    @staticmethod
    async def _read_pending(
        sub: Any,
        decoder: Decoder[M],
        replay: Replay[M],
        limit: int,
        batch: int,
        on_progress: Callable[[int, int], None] | None,
        reject: Callable[[Rejected, Any], None],
    ) -> None:
        wanted = min(replay.available, limit)
        read = timeouts = 0
        while read < wanted:
            try:
                msgs = await sub.fetch(batch=min(batch, wanted - read), timeout=FETCH_TIMEOUT_S)
            except asyncio.TimeoutError:  # nats-py raises its own subclass, or the plain one
                # Messages expired by retention while we read, or a stall of this
                # machine: what arrives late waits in the subscription for the next fetch.
                timeouts += 1
                if timeouts >= FETCH_ATTEMPTS:
                    break
                continue
            timeouts = 0
            for msg in msgs:
                try:
                    replay.items.append(decoder.decode(msg.data, msg.headers))
                except Rejected as exc:
                    replay.rejected += 1
                    reject(exc, msg)
                else:
                    replay.traces.append(sent_under(msg.headers))
            read += len(msgs)
            if on_progress is not None:
                on_progress(read, wanted)

    async def last(self, stream: str, subject: str, target: type[M] | TypeAdapter[M]) -> M | None:
        """The newest message of one literal `subject` in `stream` (None: none, or invalid).
        Raises StreamMissing when the stream does not exist."""
        js = self.nc.jetstream()
        try:
            await js.stream_info(stream)
        except NotFoundError:
            raise StreamMissing(f"stream {stream} not found") from None
        except NatsError as exc:
            raise _unavailable(stream, exc) from None
        try:
            raw = await js.get_last_msg(stream, subject)
        except NotFoundError:
            return None
        except NatsError as exc:
            raise _unavailable(stream, exc) from None
        try:
            return Decoder(target).decode(raw.data or b"", raw.headers)
        except Rejected as exc:
            self.rejections.record(f"{stream}:last", exc.code, exc.reason, subject)
            return None

    async def durable(
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
        """A pull consumer of `subject` in `stream` named `durable`, kept by the server across
        restarts: binding the name again resumes after the last acked message. A message not
        acked within `ack_wait_s` comes again, at most `max_deliver` times. Starts at the stream's
        first message (`deliver_new`: the next one); StreamMissing if the stream is not there."""
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
    """A pull subscription bound to a durable JetStream consumer (`Bus.jetstream.durable`)."""

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
        except asyncio.TimeoutError:  # nats-py raises its own subclass, or the plain one
            return []
        out: list[Received[M]] = []
        for msg in msgs:
            try:
                model = self._decoder.decode(msg.data, msg.headers)
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
