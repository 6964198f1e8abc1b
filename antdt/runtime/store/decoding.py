"""Values read back from etcd → typed models, at one boundary: whatever the bytes (a hand
edit, a newer version, a torn write), the caller gets the model or `StoredValueInvalid`,
and each refusal is counted (by value type, exported as `antdt.store.values.rejected`)
and logged (the 1st, 2nd, 4th... of each type)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, TypeVar

import structlog
from pydantic import BaseModel, ValidationError

from antdt.runtime.telemetry import metrics

T = TypeVar("T", bound=BaseModel)
log = structlog.get_logger("antdt.store")

#: Refusals of stored values in this process, by value type (what the metric exports).
REJECTED: Counter[str] = Counter()


class StoredValueInvalid(ValueError):
    """A value read from etcd is not the type its key holds (kept, never acted on)."""

    def __init__(self, key: str, kind: str, reason: str) -> None:
        super().__init__(f"{kind} at {key!r} unreadable: {reason}")
        self.key = key
        self.kind = kind
        self.reason = reason


def decode_stored(key: str, value: bytes, model: type[T]) -> T:
    """The `model` stored at `key`; StoredValueInvalid otherwise."""
    try:
        found: T = model.__pydantic_validator__.validate_json(value)
    except ValidationError as exc:
        raise _refused(key, model.__name__, _short(exc)) from None
    return found


def decode_text(key: str, value: bytes) -> str:
    """A plain-text value (an owner's replica id); StoredValueInvalid if not UTF-8."""
    try:
        return value.decode()
    except UnicodeDecodeError as exc:
        raise _refused(key, "text", str(exc)[:200]) from None


def decode_object(key: str, value: bytes) -> dict[str, Any]:
    """A JSON object read without its model (the model belongs to another service)."""
    try:
        fields = json.loads(value)
    except (ValueError, RecursionError):  # RecursionError: deeply nested arrays
        raise _refused(key, "object", "not JSON") from None
    if not isinstance(fields, dict):
        raise _refused(key, "object", f"a JSON {type(fields).__name__}, not an object")
    return fields


def _refused(key: str, kind: str, reason: str) -> StoredValueInvalid:
    REJECTED[kind] += 1
    metrics.stored_value_rejected(kind)
    seen = REJECTED[kind]
    if seen & (seen - 1) == 0:  # the 1st, 2nd, 4th, 8th... of its type: bounded, never silent
        log.warning("stored value rejected", key=key, kind=kind, reason=reason, seen=seen)
    return StoredValueInvalid(key, kind, reason)


def _short(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ())) or "value"
    return f"{loc}: {err.get('msg', 'invalid')}"[:300]
