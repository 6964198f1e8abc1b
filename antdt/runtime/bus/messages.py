"""What the NATS seam hands its users, without importing nats: errors, the delivery of a
message, decoding and validation at the boundary, rejection counting, reply decoding.
`antdt.runtime.bus` re-exports all of it."""

from __future__ import annotations

import gzip
import json
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, NamedTuple, TypeVar

import structlog
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanContext
from pydantic import BaseModel, TypeAdapter, ValidationError

from antdt.schemas import (
    COMPRESS_OVER_BYTES,
    ENCODING_HEADER,
    GZIP,
    MAX_MESSAGE_BYTES,
    REPLY_HEADER,
    ErrorCode,
    ErrorReply,
)

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


class StreamUnanswered(BusError):
    """A stream takes the subject but none of its servers answered the publish: its
    replicas electing a leader (a node of the cluster lost or just started). Worth
    trying again, as a publish whose ack timed out."""


class Rejected(ValueError):
    """Raised by a handler to refuse a message with a machine code and a clear reason."""

    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = ErrorCode(code)  # an unknown code fails here, in the handler
        self.reason = reason


@dataclass
class Replay(Generic[M]):
    """What a bounded read of a stream returned (`Bus.jetstream.read`)."""

    items: list[M]
    available: int  # messages matching the filter when the read began
    rejected: int = 0  # stored messages that failed validation (skipped)
    # The span each item was sent under (its traceparent header; None: none), in step
    # with `items`: a reader that carries on what a message started joins its trace.
    traces: list[SpanContext | None] = field(default_factory=list)

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
        # What one message of the target may hold, inflated: a model scaling with the
        # job (JobHealth) says its own (`max_message_bytes`); any other MAX_MESSAGE_BYTES.
        self.max_bytes: int = getattr(target, "max_message_bytes", MAX_MESSAGE_BYTES)

    def decode(self, data: bytes, headers: Mapping[str, str] | None = None) -> M:
        """The message of `data`, inflated first when its `Content-Encoding` header says
        so; refused (Rejected) when over `max_bytes` or invalid."""
        encoding = headers.get(ENCODING_HEADER) if headers else None
        if encoding is not None:
            data = inflate(data, encoding, self.max_bytes)
        if len(data) > self.max_bytes:
            raise Rejected(
                ErrorCode.TOO_LARGE, f"message of {len(data)} bytes exceeds {self.max_bytes}"
            )
        try:
            return self._validate_json(data)
        except ValidationError as exc:
            raise Rejected(ErrorCode.BAD_REQUEST, short_validation_error(exc)) from None


def inflate(data: bytes, encoding: str, max_bytes: int) -> bytes:
    """`data` decompressed as `encoding` says (gzip only), never past `max_bytes`: a
    small payload must not inflate into gigabytes."""
    if encoding != GZIP:
        raise Rejected(ErrorCode.BAD_REQUEST, f"{ENCODING_HEADER} {encoding!r}: expected gzip")
    inflater = zlib.decompressobj(wbits=31)  # the gzip format, as gzip.compress writes it
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise Rejected(ErrorCode.BAD_REQUEST, f"gzip payload unreadable: {exc}") from None
    if len(out) > max_bytes:
        raise Rejected(ErrorCode.TOO_LARGE, f"message inflates past {max_bytes} bytes")
    if not inflater.eof or inflater.unused_data:
        raise Rejected(ErrorCode.BAD_REQUEST, "gzip payload truncated or followed by bytes")
    return out


_PLAIN: Mapping[str, str] = MappingProxyType({})


def deflated(data: bytes) -> tuple[bytes, Mapping[str, str]]:
    """`data` and the headers it goes with: gzipped (fastest level, no timestamp) when over
    COMPRESS_OVER_BYTES. A job's health grows with its ranks (~170 bytes a rank: 1.7 MB at
    10,000) past nats-server's max_payload (1 MiB by default); gzip takes it to ~0.4."""
    if len(data) <= COMPRESS_OVER_BYTES:
        return data, _PLAIN
    return gzip.compress(data, compresslevel=1, mtime=0), {ENCODING_HEADER: GZIP}


def short_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "message"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def encode(model: BaseModel) -> bytes:
    # Straight to bytes, as model_dump_json's own serializer makes them: model_dump_json
    # returns them as a str, only for every message sent to encode it again.
    return model.__pydantic_serializer__.to_json(model)


class Rejections:
    """Counts rejected messages by (subscription, code); logs each reason the first time."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, ErrorCode]] = Counter()

    def record(self, pattern: str, code: ErrorCode, reason: str, subject: str) -> None:
        key = (pattern, code)
        self.counts[key] += 1
        if self.counts[key] == 1:
            log.warning("message rejected", subject=subject, code=code, reason=reason)

    def total(self, pattern: str | None = None) -> int:
        return sum(n for (p, _), n in self.counts.items() if pattern is None or p == pattern)


def trace_headers(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """`extra` plus the current trace context (W3C traceparent). Asked for every message
    sent: an empty context (no span, no baggage) has nothing to inject, and telling so
    costs a tenth of letting the propagators find it out."""
    headers: dict[str, str] = dict(extra or {})
    if otel_context.get_current():
        propagate.inject(headers)
    return headers


def sent_under(headers: Mapping[str, str] | None) -> SpanContext | None:
    """The span a message was sent under, from its W3C traceparent (None: none)."""
    if not headers:
        return None
    sent = trace.get_current_span(propagate.extract(headers)).get_span_context()
    return sent if sent.is_valid else None


_ERROR_FIELDS = set(ErrorReply.model_fields)
_ERROR_NAME = ErrorReply.__name__


def reply_headers(request: Mapping[str, str] | None, reply: BaseModel) -> dict[str, str]:
    """The headers of the reply to a request with `request` headers: those echoed (the
    trace context) but its `Content-Encoding` (a reply is never compressed), and the
    reply's type (`Antdt-Reply`)."""
    headers = dict(request) if request else {}
    headers.pop(ENCODING_HEADER, None)
    headers[REPLY_HEADER] = type(reply).__name__
    return headers


def decode_reply(
    data: bytes,
    reply_type: type[R],
    headers: Mapping[str, str] | None = None,
    *,
    require_type: bool = False,
) -> R:
    """A reply is either `reply_type` or an ErrorReply (raised as RequestRefused), as its
    `Antdt-Reply` header says. Without the header (a service older than typed replies)
    the payload's fields tell, unless `require_type` (BusError then)."""
    marker = headers.get(REPLY_HEADER) if headers else None
    if marker is not None:
        return _decode_typed(data, reply_type, marker)
    if require_type:
        raise BusError(f"reply without its {REPLY_HEADER} header (expected {reply_type.__name__})")
    return _decode_untyped(data, reply_type)


def _decode_typed(data: bytes, reply_type: type[R], marker: str) -> R:
    if marker == _ERROR_NAME:
        try:
            refusal = ErrorReply.__pydantic_validator__.validate_json(data)
        except ValidationError as exc:  # e.g. a code this version does not know
            raise BusError(f"bad error reply: {short_validation_error(exc)}") from None
        raise RequestRefused(refusal)
    if marker != reply_type.__name__:
        raise BusError(f"reply of type {marker!r}, expected {reply_type.__name__}")
    try:
        return reply_type.__pydantic_validator__.validate_json(data)  # type: ignore[no-any-return]
    except ValidationError as exc:
        raise BusError(f"bad reply: {short_validation_error(exc)}") from None


def _decode_untyped(data: bytes, reply_type: type[R]) -> R:
    try:  # the common case first, straight from bytes: half the cost of loads + validate
        return reply_type.__pydantic_validator__.validate_json(data)  # type: ignore[no-any-return]
    except ValidationError as exc:
        mismatch = exc
    try:
        raw: Any = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
        raise BusError("reply is not JSON") from None
    # Models forbid extra fields, so an ErrorReply never passes as another reply type.
    if isinstance(raw, dict) and {"error", "code"} <= set(raw) <= _ERROR_FIELDS:
        try:
            refusal = ErrorReply.model_validate(raw)
        except ValidationError as exc:  # e.g. a code this version does not know
            raise BusError(f"bad error reply: {short_validation_error(exc)}") from None
        raise RequestRefused(refusal)
    raise BusError(f"bad reply: {short_validation_error(mismatch)}") from None
