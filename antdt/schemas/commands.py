"""Controller → agent commands (a discriminated union on `kind`), acks and action records."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter, model_validator

from antdt.schemas.base import Count, Rank, Timestamp, Token, WireModel
from antdt.schemas.plan import Plan, check_accumulation

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
    micro_batch: tuple[Count, ...] | None = None
    accumulation: tuple[int, ...] | None = None
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
    """A custom policy's suggestion (request/reply on `{p}.{job}.proposal`); the controller
    owning the job applies the guardrails of every policy before acting. The reply is the
    ActionRecord, or an ErrorReply saying why the proposal was refused."""

    proposal_id: ActionId = Field(
        description="Idempotency key: the same id gets the same answer, never a second plan"
    )
    job: Token
    source: str = Field(max_length=128, description="Who proposes (policy process name)")
    local_batch: tuple[Count, ...] = Field(min_length=1, description="Per-rank samples per step")
    micro_batch: tuple[Count, ...] | None = Field(
        default=None, description="As in Plan: ceil(local_batch / accumulation) per rank"
    )
    accumulation: tuple[int, ...] | None = Field(
        default=None, description="As in Plan: micro-steps per step per rank (None: 1)"
    )
    plan_version: Count | None = Field(
        default=None,
        description="Version of the plan the proposal was computed from; refused as stale "
        "when the job's plan has moved on (None: not checked)",
    )
    reason: str = Field(default="", max_length=512)
    incident_id: str | None = Field(default=None, max_length=128)

    @model_validator(mode="after")
    def _consistent(self) -> ActionProposal:
        check_accumulation(self.local_batch, self.micro_batch, self.accumulation)
        return self
