"""The base every wire message shares: frozen, strict about unknown fields, finite numbers."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal[1] = 1

#: Job ids and host names travel inside NATS subjects and etcd keys: no dots,
#: wildcards, slashes or whitespace.
Token = Annotated[
    str,
    Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_\-]+$"),
]
Rank = Annotated[int, Field(ge=0, lt=1_000_000, description="Rank index within the job")]
Seconds = Annotated[float, Field(ge=0.0, le=1e7, description="Duration in seconds")]
Timestamp = Annotated[float, Field(ge=0.0, description="Unix time in seconds")]
Count = Annotated[int, Field(ge=0)]

#: The largest message any AntDT subject accepts, in bytes (inflated), unless its model
#: says otherwise (`max_message_bytes`: JobHealth, whose columns grow with the job).
MAX_MESSAGE_BYTES = 256 * 1024
#: The largest JobHealth accepted, inflated: ~170 bytes a rank, so ~390,000 ranks.
MAX_HEALTH_BYTES = 64 * 1024 * 1024
#: The largest message carrying a plan accepted, inflated (Plan, AdjustBatch, ActionRecord,
#: ActionProposal): up to three numbers a rank, a few bytes each, for 100,000 ranks (the
#: largest JobSpec.world_size); 256 KiB held one batch a rank for ~60,000 ranks, three
#: (micro-batches and accumulation) for ~25,000.
MAX_PLAN_BYTES = 8 * 1024 * 1024
#: A payload over this many bytes is sent gzipped, with the header below saying so.
COMPRESS_OVER_BYTES = 64 * 1024
#: The NATS header of a compressed payload (HTTP's name; its one value here: "gzip").
ENCODING_HEADER = "Content-Encoding"
GZIP = "gzip"

#: The NATS header every reply carries: its message's name (the model's class name), or
#: `ErrorReply` for a refusal. A requester reads it to tell which of the two it got.
REPLY_HEADER = "Antdt-Reply"


class WireModel(BaseModel):
    """Base of every message on the bus: immutable, closed, finite."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    schema_version: Literal[1] = Field(
        default=SCHEMA_VERSION, description="Wire schema version of this message"
    )


ModelT = TypeVar("ModelT", bound=BaseModel)
_set = object.__setattr__
_new = object.__new__
#: Per model class: its fields in order, each holding its default (or _REQUIRED), and
#: the names of those it requires.
_TEMPLATES: dict[type[BaseModel], tuple[dict[str, Any], frozenset[str]]] = {}
_REQUIRED: Any = object()


def unset(value: object) -> bool:
    """Fields added after the first release stay off the wire at their default (None or
    False), so a receiver of an earlier version, which refuses fields it does not know,
    is sent none it would not act on (`Field(exclude_if=unset)`)."""
    return value is None or value is False


def trusted(cls: type[ModelT], fields: dict[str, Any]) -> ModelT:
    """`cls(**fields)` without validation, in a third of its time: for values a service
    computed from state it validated (a shards replica builds a grant and a reply per
    request). The receiver validates them as any message (decode_reply), so a bug here
    is refused there, never trusted. Every required field must be given; `fields`
    must hold only fields of `cls` (TypeError otherwise: a typo must not pass silently)."""
    template, required = _TEMPLATES.get(cls) or _template(cls)
    values = template.copy()  # in field order, as validation would order them
    values.update(fields)
    if len(values) != len(template) or not fields.keys() >= required:
        raise TypeError(f"{cls.__name__}: unknown or missing fields in {sorted(fields)}")
    new = _new(cls)
    _set(new, "__dict__", values)
    _set(new, "__pydantic_fields_set__", set(fields))
    _set(new, "__pydantic_extra__", None)
    _set(new, "__pydantic_private__", None)
    return new


def _template(cls: type[BaseModel]) -> tuple[dict[str, Any], frozenset[str]]:
    if cls.model_config.get("extra") != "forbid" or cls.__private_attributes__:
        raise TypeError(f"{cls.__name__} may hold extra or private values: build it validated")
    if any(info.default_factory is not None for info in cls.model_fields.values()):
        # One default object would be shared by every instance built here.
        raise TypeError(f"{cls.__name__} has a default factory: build it validated")
    template = {
        name: _REQUIRED if info.is_required() else info.default
        for name, info in cls.model_fields.items()
    }
    required = frozenset(name for name, value in template.items() if value is _REQUIRED)
    _TEMPLATES[cls] = template, required
    return template, required


def replaced(model: ModelT, changes: dict[str, Any]) -> ModelT:
    """`model.model_copy(update=changes)` (no validation, as there), in half its time.

    A shards replica copies a ledger and a reply or two per request; pydantic's generic
    copy (copy.copy of each part, its update bookkeeping) was a tenth of the ledger's
    own work. Only for values already valid for their fields."""
    cls = type(model)
    new = cls.__new__(cls)
    fields = model.__dict__.copy()
    fields.update(changes)
    _set(new, "__dict__", fields)
    _set(new, "__pydantic_fields_set__", model.__pydantic_fields_set__ | changes.keys())
    extra, private = model.__pydantic_extra__, model.__pydantic_private__
    _set(new, "__pydantic_extra__", None if extra is None else dict(extra))
    _set(new, "__pydantic_private__", None if private is None else dict(private))
    return new
