"""Refusals: `ErrorReply` and the closed set of codes it and a bus's rejection counts use."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import Field, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from antdt.schemas.base import WireModel


class ErrorCode(str, Enum):
    """Why a message was refused: `ErrorReply.code` on the wire (the member's value) and
    the code a bus counts a rejection under. Each member's `description` says when.
    Adding one is a contract change: a receiver that does not know it refuses the reply."""

    description: str

    # ErrorCode("stale") looks a member up (Enum's call); only a member's definition
    # comes here, with its description.
    def __new__(cls, value: str, description: str = "") -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.description = description
        return member

    # As enum.StrEnum (3.11+) does: the value, not "ErrorCode.STALE", in logs and labels.
    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)

    BAD_REQUEST = (
        "bad_request",
        "malformed, or inconsistent with its subject, job, rank or world size: "
        "the same message gets the same answer",
    )
    TOO_LARGE = (
        "too_large",
        "the message, or the ledger write it needs, is over a size limit "
        "(MAX_MESSAGE_BYTES, the shards service's max_txn_bytes)",
    )
    INTERNAL = "internal", "the handler failed (a bug); the reason names the exception"
    UNKNOWN_JOB = "unknown_job", "the job is not registered"
    UNKNOWN_RANK = "unknown_rank", "the proposal names ranks the job does not have"
    UNKNOWN_CHECKPOINT = (
        "unknown_checkpoint",
        "the restore names a checkpoint whose ledger snapshot is not kept",
    )
    UNAVAILABLE = (
        "unavailable",
        "the service cannot answer now (shutting down, registering the job, its store "
        "unreachable): retry",
    )
    BUSY = "busy", "the job's ledger was contended by other writers: retry as is"
    STALE = (
        "stale",
        "made from an older state than the receiver's (epoch, plan version, checkpoint)",
    )
    FENCED = "fenced", "the shard is not held by this rank and attempt (taken back)"
    REMOVED = "removed", "the rank was removed from the job: final"
    INCARNATION = (
        "incarnation",
        "the process belongs to an older incarnation of the job, which restored since: final",
    )
    NOT_READ = (
        "not_read",
        "the restore token is new to the ledger: the restore needs its snapshot read first",
    )
    GUARDRAIL = "guardrail", "the proposal breaks a guardrail (memory, batch bounds, change)"
    NO_CHANGE = "no_change", "the proposal is the plan running now"
    HOLD = "hold", "a timing guardrail holds changes (cooldown, restart, settling)"
    BAD_ACK = "bad_ack", "a command's reply that is neither an Ack nor an ErrorReply"
    BAD_REPLY = "bad_reply", "a gathered reply neither of the type asked for nor an ErrorReply"
    SLOW_CONSUMER = (
        "slow_consumer",
        "dropped by the NATS client: its subscription's queue was full (counted)",
    )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema: dict[str, Any] = handler.resolve_ref_schema(handler(core_schema))
        codes = "\n".join(f"- `{code.value}`: {code.description}" for code in cls)
        schema["description"] = f"Why a message was refused.\n\n{codes}"
        return schema


class ErrorReply(WireModel):
    """The answer to any request that was refused: a machine code and a clear reason."""

    error: str = Field(max_length=2048, description="Human-readable reason")
    code: ErrorCode = Field(description="Why, as a machine reads it")
