"""Job specs and plans: who processes how many samples per step."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from antdt.schemas.base import MAX_PLAN_BYTES, Count, Timestamp, Token, WireModel, unset

PolicyParam = float | int | str | bool


class MonitorParams(WireModel):
    """The monitor's detection tunables for one job; one left None takes the replica's
    default (`ANTDT_WINDOW`, `ANTDT_SLOW_THRESHOLD`, ..., else the detector's own). Ratios
    compare a rank's compute cost per sample with the job's healthy reference. A
    combination the monitor cannot use (slow_threshold above the replica's
    instant_threshold) makes it use the replica's defaults for the whole job, logged."""

    window: int | None = Field(
        default=None,
        ge=2,
        le=10_000,
        description="W: events per detection window, per rank (steps)",
    )
    slow_threshold: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="δ: a step is slow at a cost >= 1+δ times the job's healthy reference, "
        "a leader's window at <= 1-δ (fraction)",
    )
    instant_threshold: float | None = Field(
        default=None,
        gt=0.0,
        le=100.0,
        description="Opens an incident in one window whose level is >= 1+this times the "
        "reference (fraction, >= δ)",
    )
    open_windows: int | None = Field(
        default=None, ge=1, le=1000, description="Deviating windows in a row to open (windows)"
    )
    resolve_windows: int | None = Field(
        default=None, ge=1, le=1000, description="Normal windows in a row to resolve (windows)"
    )
    persistent_windows: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="K: deviating windows after a normal one that make it persistent (windows)",
    )
    warmup_windows: int | None = Field(
        default=None, ge=0, le=1000, description="First windows of each rank ignored (windows)"
    )
    stall_factor: float | None = Field(
        default=None,
        gt=0.0,
        le=1000.0,
        description="Stalled when silent this many median step times (multiple of step time)",
    )
    min_stall_s: float | None = Field(
        default=None,
        ge=0.0,
        le=86_400.0,
        description="... and at least this long to be stalled (seconds)",
    )
    leaders: bool | None = Field(
        default=None, description="Open incidents for leaders (ranks faster than the rest) too"
    )
    link_rtt_factor: float | None = Field(
        default=None,
        exclude_if=unset,
        ge=1.0,
        le=1000.0,
        description="A rank's link is slow when its round trip to nats-server exceeds this "
        "many times the other ranks' median ... (multiple)",
    )
    link_rtt_floor_s: float | None = Field(
        default=None,
        exclude_if=unset,
        ge=0.0,
        le=60.0,
        description="... and their median plus this much (seconds)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> MonitorParams:
        slow, instant = self.slow_threshold, self.instant_threshold
        if slow is not None and instant is not None and instant < slow:
            raise ValueError("instant_threshold must be >= slow_threshold")
        return self

    def overrides(self) -> dict[str, float | int | bool]:
        """The fields this job sets, by name (the detector's tunables share the names)."""
        return self.model_dump(exclude_none=True, exclude={"schema_version"})


class JobSpec(WireModel):
    """What a job is: registered once, stored at jobs/{job}/spec."""

    job: Token = Field(description="Job id")
    world_size: int = Field(ge=1, le=100_000, description="Ranks in the job")
    dataset_size: int = Field(ge=1, description="Samples per epoch")
    shard_size: int = Field(ge=1, description="Samples per shard")
    global_batch: int = Field(
        ge=1,
        le=2**31 - 1,
        description="Samples per step over all ranks (below 2**31: the planners split it "
        "in 64-bit integer arrays, where two batches' product must fit)",
    )
    epochs: int = Field(default=1, ge=1, description="Epochs to run")
    seed: int = Field(default=0, ge=0, description="Seed of the per-epoch shard shuffle")
    policy: str = Field(default="none", max_length=64, description="Controller policy name")
    policy_params: dict[str, PolicyParam] = Field(
        default_factory=dict,
        description="Tunables of the policy and of the guardrails every policy and proposal "
        "is held to (cooldown_s, settle_steps, max_change, ...); absent ones take the "
        "defaults (`{p}.{job}.spec.get` serves the values in force)",
    )
    min_local_batch: int = Field(default=1, ge=0, description="Smallest local batch a plan gives")
    max_local_batch: int | None = Field(
        default=None, ge=1, description="Largest local batch a plan gives (None: global batch)"
    )
    monitor: MonitorParams | None = Field(
        default=None, description="Detection tunables for this job (None: the monitor's defaults)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.min_local_batch * self.world_size > self.global_batch:
            raise ValueError("min_local_batch * world_size exceeds global_batch")
        if self.max_local_batch is not None and self.max_local_batch < self.min_local_batch:
            raise ValueError("max_local_batch < min_local_batch")
        return self

    def equal_shares(self) -> tuple[int, ...]:
        """The global batch split as evenly as integers allow."""
        base, extra = divmod(self.global_batch, self.world_size)
        return tuple(base + (1 if r < extra else 0) for r in range(self.world_size))


class Plan(WireModel):
    """Per-rank batch sizes from an effective step on; versioned, CAS-written by the controller."""

    #: A batch (and micro-batch, accumulation) per rank: accepted up to this size.
    max_message_bytes: ClassVar[int] = MAX_PLAN_BYTES

    job: Token = Field(description="Job id")
    version: Count = Field(
        description="This plan's version: 0 for the initial even split, one more per plan "
        "written; agents ignore older versions"
    )
    local_batch: tuple[Count, ...] = Field(min_length=1, description="Samples per rank per step")
    micro_batch: tuple[Count, ...] | None = Field(
        default=None,
        description="Per-rank largest micro-batch, ceil(local_batch / accumulation): what "
        "the rank's memory holds at once (None: equal to local_batch)",
    )
    accumulation: tuple[int, ...] | None = Field(
        default=None,
        description="Per-rank micro-steps per step, gradients accumulated before the "
        "all-reduce: chunks of micro_batch samples, the last one the rest (None: 1)",
    )
    effective_step: Count = Field(description="First step that runs under this plan")
    reason: str = Field(default="", max_length=512, description="Why this plan was made")
    policy: str = Field(
        default="none",
        max_length=64,
        description="Who made it: the policy's name, or `proposal:<source>` for a proposal",
    )
    created_at: Timestamp

    @model_validator(mode="after")
    def _consistent(self) -> Plan:
        if sum(self.local_batch) <= 0:
            raise ValueError("a plan must give at least one sample per step")
        n = len(self.local_batch)
        for name in ("micro_batch", "accumulation"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} has {len(value)} entries for {n} ranks")
        check_accumulation(self.local_batch, self.micro_batch, self.accumulation)
        return self

    def micro_batches(self, rank: int) -> tuple[int, ...]:
        """The sizes of `rank`'s micro-batches in one step, in order (see `split_batch`)."""
        accumulation = 1 if self.accumulation is None else self.accumulation[rank]
        return split_batch(self.local_batch[rank], accumulation)

    @property
    def global_batch(self) -> int:
        return sum(self.local_batch)

    @property
    def world_size(self) -> int:
        return len(self.local_batch)


def split_batch(local_batch: int, accumulation: int) -> tuple[int, ...]:
    """`local_batch` samples as `accumulation` micro-batches of m = ceil(local_batch /
    accumulation) samples, the last one the rest: split_batch(10, 3) == (4, 4, 2). What
    the agent's `Step.micro_batches` yields (chunks of the plan's micro-batch)."""
    if local_batch == 0:
        return (0,)
    m = -(-local_batch // accumulation)
    return (m,) * (accumulation - 1) + (local_batch - m * (accumulation - 1),)


def check_accumulation(
    local_batch: tuple[int, ...],
    micro_batch: tuple[int, ...] | None,
    accumulation: tuple[int, ...] | None,
) -> None:
    """Raise ValueError unless micro-batches and accumulation are absent together, or per
    rank b, m, a: 1 <= a <= max(b, 1), m == ceil(b / a) and a == ceil(b / m) when b > 0.
    So chunks of m samples (the last one the rest) number exactly a, none empty."""
    if micro_batch is None and accumulation is None:
        return
    if micro_batch is None or accumulation is None:
        raise ValueError("micro_batch and accumulation come together (or neither)")
    if not len(local_batch) == len(micro_batch) == len(accumulation):
        raise ValueError("local_batch, micro_batch and accumulation differ in length")
    for rank, (b, m, a) in enumerate(zip(local_batch, micro_batch, accumulation, strict=True)):
        if not 1 <= a <= max(b, 1):
            raise ValueError(f"rank {rank}: accumulation {a} outside [1, {max(b, 1)}]")
        if m != -(-b // a):
            raise ValueError(f"rank {rank}: micro_batch {m} is not ceil({b} / {a})")
        if b > 0 and a != -(-b // m):
            raise ValueError(f"rank {rank}: {a} micro-steps where ceil({b} / {m}) suffice")


class PlanRequest(WireModel):
    """Asks any controller replica for the job's current plan (`{p}.{job}.plan.get`)."""

    job: Token = Field(description="Job id; must match the subject's")
    rank: int | None = Field(
        default=None,
        exclude_if=unset,
        ge=0,
        description="The asking rank (agents send it; refused as unknown_rank when outside "
        "the job); null or absent: asked by a non-rank (a policy, a dashboard)",
    )


class RegisterReply(WireModel):
    """The controller's answer to a job registration."""

    spec: JobSpec = Field(description="The job's spec as stored (the first registration's)")
    plan: Plan = Field(description="The job's current plan")
    created: bool = Field(description="True when this request created the job")


class SpecRequest(WireModel):
    """Asks any controller replica for a job's spec and the guardrails in force
    (`{p}.{job}.spec.get`); answered with a SpecReply."""

    job: Token = Field(description="Job id; must match the subject's")


class GuardrailSettings(WireModel):
    """The guardrails in force for a job: its `policy_params`, defaults filled in."""

    cooldown_s: float = Field(
        ge=0, description="Seconds after the job's last action before the next (proposals too)"
    )
    settle_steps: int = Field(
        ge=0,
        description="Steps after a plan's effective_step (or a restart) before the next "
        "change; and the plan must have been measured (JobHealth.plan_version)",
    )
    min_gain: float = Field(
        ge=0, description="Built-in policies only: least predicted step-time gain to re-plan"
    )
    max_change: float = Field(
        gt=0,
        description="Bounded change: per rank, |new - current batch| <= max(1, floor("
        "max_change x max(current batch, mean batch))); SpecReply.max_move has the limits",
    )
    restart_budget: int = Field(ge=0, description="KILL_RESTARTs a job may be given in all")
    restart_cooldown_s: float = Field(ge=0, description="Seconds between two KILL_RESTARTs")
    restart_timeout_s: float = Field(
        gt=0, description="A restart not seen to resume stops holding changes after, seconds"
    )


class SpecReply(WireModel):
    """A job's spec and every bound a proposal for it is checked against, as in force when
    read (the plan, memory caps and guardrails may change after)."""

    spec: JobSpec = Field(description="The job's spec as stored, defaults included")
    plan_version: Count = Field(
        description="Version of the plan in force when read (Plan.version): what max_move "
        "is computed from"
    )
    guardrails: GuardrailSettings = Field(description="The effective guardrails")
    guardrails_error: str | None = Field(
        default=None,
        max_length=512,
        description="Why the job's policy_params did not parse, when they did not: the "
        "defaults are in force then (null: they parsed)",
    )
    min_local_batch: tuple[Count, ...] = Field(
        description="Per rank: the smallest local batch a plan may give it"
    )
    max_local_batch: tuple[Count, ...] = Field(
        description="Per rank: the largest local batch a plan may give it (the spec's "
        "max_local_batch, its memory cap and the global batch, the least of them)"
    )
    memory_caps: tuple[Count | None, ...] = Field(
        description="Per rank: the largest local batch its memory holds, as its agent said "
        "(RankHello.max_local_batch; null: not said)"
    )
    max_move: tuple[Count, ...] = Field(
        description="Per rank: how far its batch may move from the plan in force in one "
        "proposal (the bounded change, see GuardrailSettings.max_change)"
    )
