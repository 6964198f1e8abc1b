"""What agents and the monitor publish: step events, hellos, exits, incidents (the job's
health: health.py)."""

from __future__ import annotations

from enum import Enum

from pydantic import Field, model_validator

from antdt.schemas.base import (
    Count,
    Rank,
    Seconds,
    Timestamp,
    Token,
    WireModel,
    unset,
)


class StepEvent(WireModel):
    """One training step of one rank, published by the agent after the step ends."""

    job: Token = Field(description="Job id")
    rank: Rank
    host: Token = Field(description="Host (node) the rank runs on")
    step: Count = Field(description="Global step index, the same on every rank")
    epoch: Count = Field(description="Epoch the step's samples belong to")
    plan_version: Count = Field(description="Version of the plan the step ran under")
    local_batch: Count = Field(description="Samples the plan asked this rank for")
    samples: Count = Field(description="Samples this rank actually processed")
    compute_s: Seconds = Field(description="Forward+backward of its own samples, seconds")
    data_wait_s: Seconds = Field(description="Waiting for the next batch, seconds")
    comm_s: Seconds = Field(description="Gradient exchange incl. barrier wait, seconds")
    step_s: Seconds = Field(description="Wall time of the whole step, seconds")
    started_at: Timestamp
    ended_at: Timestamp
    link_rtt_s: float | None = Field(
        default=None,
        exclude_if=unset,
        ge=0.0,
        le=1e7,
        description="The rank's round trip to the NATS server, the median of its latest "
        "probes (taken every few seconds off the training thread, not per step): its "
        "host's link to the control plane, seconds (null: not measured yet)",
    )
    helped: dict[Rank, Count] | None = Field(
        default=None,
        exclude_if=unset,
        max_length=4096,
        description="Under work sharing: samples of other ranks' shares this rank computed "
        "in the step, by owner rank (counted in `samples`; null: none)",
    )
    one_piece_s: Seconds | None = Field(
        default=None,
        exclude_if=unset,
        description="Under work sharing, when the step did not run the rank's planned batch "
        "in one pass (it offered its share as micro-batches, or took over others'): the "
        "seconds its planned batch would take in one pass at its own pace this step, "
        "which the monitor judges its speed by (null: its own samples in one pass, or "
        "not known)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> StepEvent:
        if self.ended_at < self.started_at:
            raise ValueError("ended_at is before started_at")
        parts = self.compute_s + self.data_wait_s + self.comm_s
        if parts > self.step_s * 1.05 + 1e-3:
            raise ValueError(f"compute+data+comm ({parts:.6f}s) exceed step_s ({self.step_s:.6f}s)")
        return self


class RankHello(WireModel):
    """Sent by an agent when its rank starts: who it is and what it can hold."""

    job: Token = Field(description="Job id")
    rank: Rank
    world_size: int = Field(ge=1, le=1_000_000, description="Ranks in the job")
    host: Token = Field(description="Host (node) the rank runs on")
    pid: int = Field(ge=0, description="OS process id of the rank")
    device: str = Field(default="cpu", max_length=64, description="cpu, cuda:0, ...")
    cpu_count: int = Field(default=1, ge=1, description="CPU cores visible to the rank")
    max_local_batch: int | None = Field(
        default=None, ge=1, description="Largest local batch its memory holds (None: unknown)"
    )
    started_at: Timestamp


class ExitReason(str, Enum):
    """Why a rank's process stopped (RankExit)."""

    FINISHED = "finished"  # the shards service said the job is done
    CLOSED = "closed"  # the script closed its agent before the job was done
    RESTART = "restart"  # it exits to be restarted (KILL_RESTART); it will come back


class RankExit(WireModel):
    """Sent by an agent as it closes: the rank stops on purpose, so its silence from now
    on is not a stall. Published after its last step event."""

    job: Token = Field(description="Job id")
    rank: Rank
    host: Token = Field(description="Host (node) the rank runs on")
    pid: int = Field(ge=0, description="OS process id of the rank")
    reason: ExitReason = Field(description="Why the process stops")
    step: Count = Field(description="Last step this process ran (0 if none)")
    at: Timestamp


class IncidentKind(str, Enum):
    SLOW = "slow"
    LEADER = "leader"
    STALLED = "stalled"


class StragglerClass(str, Enum):
    TRANSIENT = "transient"
    PERSISTENT = "persistent"
    DETERMINISTIC = "deterministic"
    UNKNOWN = "unknown"


class Cause(str, Enum):
    COMPUTE = "compute"
    DATA = "data"
    COMMUNICATION = "communication"
    UNKNOWN = "unknown"


class IncidentState(str, Enum):
    """Incident lifecycle, kept by the monitor alone. What the controller did about an
    incident is its ActionRecords naming the incident (`incident_id`).

    OPENED ──▶ ESCALATED ──▶ RESOLVED
       │                        ▲
       └────────────────────────┘  (recovered, with hysteresis)
    """

    OPENED = "opened"
    ESCALATED = "escalated"
    RESOLVED = "resolved"


class Incident(WireModel):
    """A straggler (or leader, or stall) on one rank, with its evidence."""

    id: str = Field(
        min_length=1,
        max_length=128,
        description="Stable id for the lifecycle: every state of one incident carries it",
    )
    job: Token = Field(description="Job id")
    rank: Rank
    host: str = Field(max_length=128, description="Host (node) the rank runs on")
    kind: IncidentKind = Field(description="slow, leader (faster than the rest) or stalled")
    straggler_class: StragglerClass = Field(
        default=StragglerClass.UNKNOWN,
        description="transient, persistent or deterministic, once the monitor can tell",
    )
    cause: Cause = Field(
        default=Cause.UNKNOWN, description="Which part of the step is slow (compute, data, ...)"
    )
    state: IncidentState = Field(description="opened, escalated or resolved")
    step: Count = Field(description="Step at which this state was reached")
    opened_at: Timestamp
    updated_at: Timestamp
    ratio: float = Field(
        ge=0,
        description="The rank's level over the job's healthy reference (RankHealth.ratio), "
        "measured at the batches of the plan in force: a speed ratio, not how far that plan "
        "is from balance (a 3x rank still shows about 3 once a plan has balanced it). Divide "
        "the rank's even share by it, not its current batch",
    )
    windows: Count = Field(description="Consecutive windows the condition held")
    evidence: dict[str, float] = Field(default_factory=dict, description="Measured figures")
    host_ranks: tuple[Rank, ...] | None = Field(
        default=None,
        exclude_if=unset,
        description="The ranks of `host` that slowed together, this one included, when the "
        "whole host is the straggler (null: this rank alone); a policy may treat them as one",
    )
