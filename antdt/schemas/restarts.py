"""KILL_RESTART state in etcd: `jobs/{job}/restarts` holds a job's `RestartLedger` (budget
used, measured costs, the restart in flight), `blocklist/{host}` a `BlocklistEntry` for a
host a rank was moved away from; the owning controller writes both in one fenced
transaction."""

from __future__ import annotations

from pydantic import Field

from antdt.schemas.base import Count, Rank, Seconds, Timestamp, Token, WireModel

#: Measured costs kept per job (the newest last); the policy uses their mean.
MAX_COSTS = 8


class PendingRestart(WireModel):
    """A KILL_RESTART decided and not yet seen to resume."""

    action_id: str = Field(
        min_length=1, max_length=128, description="The restart's action id (`{job}-restart-{N}`)"
    )
    rank: Rank
    host: Token = Field(description="The host the rank was moved away from")
    checkpoint_step: Count = Field(description="The step the job checkpoints at and resumes from")
    decided_at: Timestamp
    step_s: Seconds = Field(default=0.0, description="Step time when the restart was decided")
    reason: str = Field(default="", max_length=512, description="Why, for people")
    incident_id: str | None = Field(
        default=None, max_length=128, description="The incident acted on (null: none)"
    )
    local_batch_after: tuple[Count, ...] | None = Field(
        default=None, description="The plan from checkpoint_step + 1 on (None: unchanged)"
    )


class RestartLedger(WireModel):
    """Restart history of one job (`jobs/{job}/restarts`)."""

    count: Count = Field(default=0, description="Restarts decided (the budget used)")
    costs: tuple[Seconds, ...] = Field(
        default=(), max_length=MAX_COSTS, description="Measured restart costs, s, newest last"
    )
    last_decided_at: Timestamp | None = Field(
        default=None, description="When the newest restart was decided (null: none yet)"
    )
    last_checkpoint_step: Count | None = Field(
        default=None, description="Checkpoint step of the newest restart"
    )
    pending: PendingRestart | None = Field(
        default=None, description="The restart decided and not yet seen to resume (null: none)"
    )

    @property
    def measured_cost_s(self) -> float | None:
        """Mean of the measured restart costs (None before any measurement)."""
        return sum(self.costs) / len(self.costs) if self.costs else None


class BlocklistEntry(WireModel):
    """Why a host is avoided (`blocklist/{host}`), and until when. Delete the key (`antdt
    blocklist allow HOST`) to allow it again sooner."""

    host: Token = Field(description="The host avoided")
    job: Token = Field(description="The job whose rank was moved off it")
    rank: Rank
    action_id: str = Field(
        min_length=1, max_length=128, description="The restart that moved the rank"
    )
    reason: str = Field(default="", max_length=512, description="Why, for people")
    at: Timestamp
    until: Timestamp | None = Field(
        default=None,
        description="Unix time from which the host may be used again (what slowed it on a "
        "shared cluster, another tenant's load, comes and goes); None: until the key is "
        "deleted",
    )

    def active(self, now: float) -> bool:
        """Is the host still to be avoided at `now`?"""
        return self.until is None or now < self.until
