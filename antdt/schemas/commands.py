"""Controller → agent commands (a discriminated union on `kind`), acks and action records.

An action id names one action of the controller, unique per job: `{job}-plan-{N}` (an
ADJUST_BS writing plan version N), `{job}-restart-{N}` (the job's N-th KILL_RESTART; for
both, `{job[:80]}-{sha256(job)[:24]}` stands for the job past 128 characters),
`{job}-proposal-{proposal_id}` (an executed proposal; `{job[:80]}-proposal-{sha256[:24]}`
past 128 characters) and `<one of those, cut to 100>-refused-{unix time}` or
`...-failed-{unix time}` (the record of an action refused, or failed before anything was
sent). The command, every rank's Ack and the ActionRecord carry the same id."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, ClassVar, Literal

from pydantic import Field, TypeAdapter, model_validator

from antdt.schemas.base import MAX_PLAN_BYTES, Count, Rank, Timestamp, Token, WireModel
from antdt.schemas.plan import Plan, check_accumulation

ActionId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        description="The action's id (its idempotency key): `{job}-plan-{N}`, "
        "`{job}-restart-{N}`, `{job}-proposal-{proposal_id}`, or `...-refused-{time}` / "
        "`...-failed-{time}` (an action not carried out)",
    ),
]
IncidentRef = Annotated[
    str | None,
    Field(max_length=128, description="The incident acted on (Incident.id); null: none"),
]


class AdjustBatch(WireModel):
    """Switch to `plan` at `plan.effective_step` (ADJUST_BS)."""

    #: Carries a batch per rank: accepted up to this size.
    max_message_bytes: ClassVar[int] = MAX_PLAN_BYTES

    kind: Literal["adjust_batch"] = Field(
        default="adjust_batch", description="Which command (the union's discriminator)"
    )
    action_id: ActionId
    job: Token = Field(description="Job id")
    plan: Plan = Field(description="The new plan (its version is the one to ack)")
    incident_id: IncidentRef = None


class KillRestart(WireModel):
    """Checkpoint at `checkpoint_step`, exit with the restart code, come back elsewhere."""

    kind: Literal["kill_restart"] = Field(
        default="kill_restart", description="Which command (the union's discriminator)"
    )
    action_id: ActionId
    job: Token = Field(description="Job id")
    rank: Rank = Field(description="The rank whose host is to be replaced")
    checkpoint_step: Count = Field(
        description="Every rank checkpoints after this step; the job resumes from it"
    )
    avoid_hosts: tuple[str, ...] = Field(
        default=(), description="Hosts the restarted rank must not be placed on"
    )
    reason: str = Field(default="", max_length=512, description="Why, for people")
    incident_id: IncidentRef = None


Command = Annotated[AdjustBatch | KillRestart, Field(discriminator="kind")]
COMMAND_ADAPTER: TypeAdapter[AdjustBatch | KillRestart] = TypeAdapter(Command)
# What the bus's decoder reads of a target (a model class says it with a ClassVar; an
# adapter, final, holds it as a value): an AdjustBatch carries a plan.
setattr(COMMAND_ADAPTER, "max_message_bytes", MAX_PLAN_BYTES)  # noqa: B010


class Ack(WireModel):
    """An agent's reply to a command (the command's action id, signed by its rank)."""

    action_id: ActionId
    job: Token = Field(description="Job id")
    rank: Rank
    ok: bool = Field(description="True: the rank took the command; false: see error")
    applied_step: Count | None = Field(
        default=None,
        description="Step at which the command takes (or took) effect: for a plan, the "
        "earliest it can start at on this rank (every rank starts it at one step, once "
        "a step's count found all of them holding it)",
    )
    plan_version: Count | None = Field(
        default=None,
        description="The version of the plan the rank holds after this command (an "
        "AdjustBatch's plan.version when taken); null: not a plan command",
    )
    error: str | None = Field(
        default=None, max_length=1024, description="Why not taken (ok false); null otherwise"
    )
    at: Timestamp


class ActionResult(str, Enum):
    """APPLIED: every rank acked. PARTIAL: some did not (missing_ranks). FAILED: written or
    sent, but it did not take. REFUSED: a guardrail or check stopped it before anything."""

    APPLIED = "applied"
    PARTIAL = "partial"
    FAILED = "failed"
    REFUSED = "refused"


class ActionRecord(WireModel):
    """What the controller decided, why, and what came of it (JetStream ANTDT_ACTIONS)."""

    #: Carries a batch per rank: accepted up to this size.
    max_message_bytes: ClassVar[int] = MAX_PLAN_BYTES

    action_id: ActionId
    job: Token = Field(description="Job id")
    kind: str = Field(max_length=64, description="adjust_batch or kill_restart")
    policy: str = Field(
        max_length=64, description="Who decided: the policy's name, or `proposal:<source>`"
    )
    reason: str = Field(max_length=1024, description="Why, for people")
    incident_id: IncidentRef = None
    plan_version: Count | None = Field(
        default=None,
        description="adjust_batch: the version of the plan this action wrote (the new "
        "plan); null when no plan was written (refused, failed early, kill_restart). Not "
        "ActionProposal.plan_version, the plan a proposal was computed from",
    )
    local_batch: tuple[Count, ...] | None = Field(
        default=None, description="adjust_batch: per-rank batches written, or those refused"
    )
    micro_batch: tuple[Count, ...] | None = Field(
        default=None, description="adjust_batch: as in Plan (null: equal to local_batch)"
    )
    accumulation: tuple[int, ...] | None = Field(
        default=None, description="adjust_batch: as in Plan (null: 1)"
    )
    effective_step: Count | None = Field(
        default=None, description="adjust_batch: the plan's first step; kill_restart: checkpoint"
    )
    rank: Rank | None = Field(default=None, description="kill_restart: the rank moved")
    host: str | None = Field(default=None, max_length=128, description="kill_restart: host left")
    decided_at: Timestamp
    completed_at: Timestamp
    result: ActionResult = Field(description="What came of it")
    acked_ranks: tuple[Rank, ...] = Field(default=(), description="Ranks that acked")
    missing_ranks: tuple[Rank, ...] = Field(
        default=(), description="Ranks that did not ack in time"
    )
    error: str | None = Field(
        default=None,
        max_length=1024,
        description="Why refused or failed (`code: reason` for a refused proposal)",
    )


class ActionProposal(WireModel):
    """A custom policy's suggestion (request/reply on `{p}.{job}.proposal`); the controller
    owning the job applies the guardrails of every policy before acting. The reply is the
    ActionRecord, or an ErrorReply saying why the proposal was refused."""

    #: Carries a batch per rank: accepted up to this size.
    max_message_bytes: ClassVar[int] = MAX_PLAN_BYTES

    proposal_id: str = Field(
        min_length=1,
        max_length=128,
        description="The proposer's idempotency key: the same id gets the same record, never "
        "a second plan; the action executing it is `{job}-proposal-{proposal_id}`",
    )
    job: Token = Field(description="Job id; must match the subject's")
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
        description="Version of the plan the proposal was computed from (not the plan it "
        "would make: that is ActionRecord.plan_version); refused as stale when the job's "
        "plan has moved on (null: not checked)",
    )
    reason: str = Field(default="", max_length=512, description="Why, for people")
    incident_id: IncidentRef = None

    @model_validator(mode="after")
    def _consistent(self) -> ActionProposal:
        check_accumulation(self.local_batch, self.micro_batch, self.accumulation)
        return self
