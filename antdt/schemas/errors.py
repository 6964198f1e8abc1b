"""Refusals: `ErrorReply`, the closed set of codes it and a bus's rejection counts use, and
what a client should do about each code (`ClientAction`)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import Field, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from antdt.schemas.base import WireModel


class ClientAction(str, Enum):
    """What a client should do with a refusal of a given code (`ErrorCode.action`)."""

    RETRY = "retry"  # the same request later (with backoff): the receiver may say yes then
    REFRESH = "refresh"  # re-read what the request was made from (plan, epoch), make a new one
    FIX = "fix"  # change the request: as it is, it gets the same answer every time
    GIVE_UP = "give_up"  # final: the job, rank or incarnation is gone, or nothing is to do
    NOT_SENT = "not_sent"  # never in a reply: a receiver counts its own rejections under it


ACTION_TEXT = {
    ClientAction.RETRY: "send the same request again later, with backoff",
    ClientAction.REFRESH: "re-read the state the request was made from, then make a new one",
    ClientAction.FIX: "change the request; as it is it gets the same answer",
    ClientAction.GIVE_UP: "final, do not retry",
    ClientAction.NOT_SENT: "never sent in a reply; a receiver counts its own rejections",
}


class ErrorCode(str, Enum):
    """Why a message was refused: `ErrorReply.code` on the wire (the member's value) and
    the code a bus counts a rejection under. Each member's `description` says when, its
    `action` what the client should do. Adding one is a contract change: a receiver that
    does not know it refuses the reply (a BusError, as a bad reply)."""

    description: str
    action: ClientAction

    # ErrorCode("stale") looks a member up (Enum's call); only a member's definition
    # comes here, with its description and action.
    def __new__(
        cls, value: str, description: str = "", action: ClientAction = ClientAction.FIX
    ) -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.description = description
        member.action = action
        return member

    # As enum.StrEnum (3.11+) does: the value, not "ErrorCode.STALE", in logs and labels.
    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)

    BAD_REQUEST = (
        "bad_request",
        "malformed (not JSON, an unknown field, a value out of range), or inconsistent with "
        "its subject, job, rank or world size: the same message gets the same answer",
        ClientAction.FIX,
    )
    TOO_LARGE = (
        "too_large",
        "the message (inflated, when gzipped), or the ledger write it needs, is over a size "
        "limit (MAX_MESSAGE_BYTES; JobHealth's MAX_HEALTH_BYTES; the shards service's "
        "max_txn_bytes)",
        ClientAction.FIX,
    )
    INTERNAL = (
        "internal",
        "the handler failed (a bug); the reason names the exception",
        ClientAction.RETRY,
    )
    UNKNOWN_JOB = (
        "unknown_job",
        "the job is not registered (register it first, or fix the job id)",
        ClientAction.FIX,
    )
    UNKNOWN_RANK = (
        "unknown_rank",
        "the request names ranks the job does not have",
        ClientAction.FIX,
    )
    UNKNOWN_CHECKPOINT = (
        "unknown_checkpoint",
        "the restore names a checkpoint whose ledger snapshot is not kept",
        ClientAction.FIX,
    )
    UNAVAILABLE = (
        "unavailable",
        "the service cannot answer now (shutting down, registering the job, its store "
        "unreachable, no replica owns the job yet): retry",
        ClientAction.RETRY,
    )
    BUSY = (
        "busy",
        "the job's ledger was contended by other writers: retry as is",
        ClientAction.RETRY,
    )
    STALE = (
        "stale",
        "made from an older state than the receiver's (epoch, plan version, checkpoint): "
        "read it again and make a new request",
        ClientAction.REFRESH,
    )
    FENCED = (
        "fenced",
        "the shard is not held by this rank and attempt (taken back): drop it, fetch anew",
        ClientAction.REFRESH,
    )
    REMOVED = "removed", "the rank was removed from the job: final", ClientAction.GIVE_UP
    INCARNATION = (
        "incarnation",
        "the process belongs to an older incarnation of the job, which restored since: final",
        ClientAction.GIVE_UP,
    )
    NOT_READ = (
        "not_read",
        "the restore token is new to the ledger: the restore needs its snapshot read first",
        ClientAction.RETRY,
    )
    GUARDRAIL = (
        "guardrail",
        "the proposal breaks a guardrail (memory, batch bounds, bounded change; "
        "`{p}.{job}.spec.get` serves them)",
        ClientAction.FIX,
    )
    NO_CHANGE = "no_change", "the proposal is the plan running now", ClientAction.GIVE_UP
    HOLD = (
        "hold",
        "a timing guardrail holds changes (cooldown, restart, settling): retry later",
        ClientAction.RETRY,
    )
    BAD_ACK = (
        "bad_ack",
        "a command's reply that is neither an Ack nor an ErrorReply (counted)",
        ClientAction.NOT_SENT,
    )
    BAD_REPLY = (
        "bad_reply",
        "a gathered reply neither of the type asked for nor an ErrorReply (counted)",
        ClientAction.NOT_SENT,
    )
    SLOW_CONSUMER = (
        "slow_consumer",
        "dropped by the NATS client: its subscription's queue was full (counted)",
        ClientAction.NOT_SENT,
    )
    JOB_ENDED = (
        "job_ended",
        "the job has ended (every rank exited); registering it again runs it anew",
        ClientAction.GIVE_UP,
    )
    BLOCKLISTED = (
        "blocklisted",
        "the node's host is on the blocklist (`antdt blocklist list`): it may not join the "
        "job's rendezvous until the entry expires or is allowed",
        ClientAction.GIVE_UP,
    )
    NODE_TAKEN = (
        "node_taken",
        "another live torchrun process holds the host's name in the job's node registry; "
        "it frees when that process stops heartbeating (its record expires)",
        ClientAction.RETRY,
    )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema: dict[str, Any] = handler.resolve_ref_schema(handler(core_schema))
        codes = "\n".join(
            f"- `{code.value}` ({code.action.value}): {code.description}" for code in cls
        )
        actions = "; ".join(f"`{a.value}`: {ACTION_TEXT[a]}" for a in ClientAction)
        schema["description"] = (
            f"Why a message was refused, and in brackets what the client should do "
            f"({actions}).\n\n{codes}"
        )
        schema["x-client-action"] = {code.value: code.action.value for code in cls}
        return schema


class ErrorReply(WireModel):
    """The answer to any request that was refused: a machine code and a clear reason. It
    comes with the NATS header `Antdt-Reply: ErrorReply`."""

    error: str = Field(max_length=2048, description="Human-readable reason")
    code: ErrorCode = Field(
        description="Why, as a machine reads it; the code's action says what to do"
    )
