"""What the NATS seam hands its users, without importing nats: errors, the delivery of a
message, decoding and validation at the boundary, rejection counting, reply decoding.
`antdt.runtime.bus` re-exports all of it."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

import structlog
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanContext
from pydantic import BaseModel, TypeAdapter, ValidationError

from antdt.schemas import MAX_MESSAGE_BYTES, REPLY_HEADER, ErrorCode, ErrorReply

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

    def decode(self, data: bytes) -> M:
        if len(data) > MAX_MESSAGE_BYTES:
            raise Rejected(
                ErrorCode.TOO_LARGE, f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}"
            )
        try:
            return self._validate_json(data)
        except ValidationError as exc:
            raise Rejected(ErrorCode.BAD_REQUEST, short_validation_error(exc)) from None


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
    trace context), and the reply's type (`Antdt-Reply`)."""
    headers = dict(request) if request else {}
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
