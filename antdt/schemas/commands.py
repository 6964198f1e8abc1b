"""Controller → agent commands (a discriminated union on `kind`), acks and action records."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from antdt.schemas.base import Count, Rank, Timestamp, Token, WireModel
from antdt.schemas.plan import Plan

ActionId = Annotated[str, Field(min_length=1, max_length=128, description="Idempotency key")]


class AdjustBatch(WireModel):
    """Switch to `plan` at `plan.effective_step` (ADJUST_BS)."""

    kind: Literal["adjust_batch"] = "adjust_batch"
    action_id: ActionId
    job: Token
    plan: Plan
    incident_id: str | None = Field(default=None, max_length=128)


class KillRestart(WireModel):
    """Checkpoint at `checkpoint_step`, exit with the restart code, come back elsewhere."""

    kind: Literal["kill_restart"] = "kill_restart"
    action_id: ActionId
    job: Token
    rank: Rank = Field(description="The rank whose host is to be replaced")
    checkpoint_step: Count
    avoid_hosts: tuple[str, ...] = ()
    reason: str = Field(default="", max_length=512)
    incident_id: str | None = Field(default=None, max_length=128)


Command = Annotated[AdjustBatch | KillRestart, Field(discriminator="kind")]
COMMAND_ADAPTER: TypeAdapter[AdjustBatch | KillRestart] = TypeAdapter(Command)


class Ack(WireModel):
    """An agent's reply to a command."""

    action_id: ActionId
    job: Token
    rank: Rank
    ok: bool
    applied_step: Count | None = Field(
        default=None, description="Step at which the command takes (or took) effect"
    )
    plan_version: Count | None = None
    error: str | None = Field(default=None, max_length=1024)
    at: Timestamp


class ActionResult(str, Enum):
    APPLIED = "applied"
    PARTIAL = "partial"
    FAILED = "failed"
    REFUSED = "refused"


class ActionRecord(WireModel):
    """What the controller decided, why, and what came of it (JetStream ANTDT_ACTIONS)."""

    action_id: ActionId
    job: Token
    kind: str = Field(max_length=64)
    policy: str = Field(max_length=64)
    reason: str = Field(max_length=1024)
    incident_id: str | None = Field(default=None, max_length=128)
    plan_version: Count | None = None
    local_batch: tuple[Count, ...] | None = None
    effective_step: Count | None = Field(
        default=None, description="adjust_batch: the plan's first step; kill_restart: checkpoint"
    )
    rank: Rank | None = Field(default=None, description="kill_restart: the rank moved")
    host: str | None = Field(default=None, max_length=128, description="kill_restart: host left")
    decided_at: Timestamp
    completed_at: Timestamp
    result: ActionResult
    acked_ranks: tuple[Rank, ...] = ()
    missing_ranks: tuple[Rank, ...] = ()
    error: str | None = Field(default=None, max_length=1024)


class ActionProposal(WireModel):
    """A custom policy's suggestion; the controller applies guardrails before acting."""

    proposal_id: ActionId
    job: Token
    source: str = Field(max_length=128, description="Who proposes (policy process name)")
    local_batch: tuple[Count, ...] = Field(min_length=1)
    reason: str = Field(default="", max_length=512)


class ErrorReply(WireModel):
    """The answer to any request that was refused: a machine code and a clear reason."""

    error: str = Field(max_length=2048, description="Human-readable reason")
    code: str = Field(max_length=64, description="bad_request, unknown_job, stale, fenced, ...")
