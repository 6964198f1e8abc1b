"""KILL_RESTART state in etcd: the per-job restart ledger and the host blocklist.

`jobs/{job}/restarts` holds one `RestartLedger` (JSON): the restart budget used, the
measured restart costs and the restart in flight, if any. `blocklist/{host}` holds one
`BlocklistEntry`: a host that a KILL_RESTART moved a rank away from. The controller
writes both in one etcd transaction fenced by its ownership of the job.
"""

from __future__ import annotations

from pydantic import Field

from antdt.schemas.base import Count, Rank, Seconds, Timestamp, Token, WireModel

#: Measured costs kept per job (the newest last); the policy uses their mean.
MAX_COSTS = 8


class PendingRestart(WireModel):
    """A KILL_RESTART decided and not yet seen to resume."""

    action_id: str = Field(min_length=1, max_length=128)
    rank: Rank
    host: Token = Field(description="The host the rank was moved away from")
    checkpoint_step: Count
    decided_at: Timestamp
    step_s: Seconds = Field(default=0.0, description="Step time when the restart was decided")
    reason: str = Field(default="", max_length=512)
    incident_id: str | None = Field(default=None, max_length=128)
    local_batch_after: tuple[Count, ...] | None = Field(
        default=None, description="The plan from checkpoint_step + 1 on (None: unchanged)"
    )


class RestartLedger(WireModel):
    """Restart history of one job (`jobs/{job}/restarts`)."""

    count: Count = Field(default=0, description="Restarts decided (the budget used)")
    costs: tuple[Seconds, ...] = Field(
        default=(), max_length=MAX_COSTS, description="Measured restart costs, s, newest last"
    )
    last_decided_at: Timestamp | None = None
    last_checkpoint_step: Count | None = Field(
        default=None, description="Checkpoint step of the newest restart"
    )
    pending: PendingRestart | None = None

    @property
    def measured_cost_s(self) -> float | None:
        """Mean of the measured restart costs (None before any measurement)."""
        return sum(self.costs) / len(self.costs) if self.costs else None


class BlocklistEntry(WireModel):
    """Why a host is avoided (`blocklist/{host}`), and until when. Delete the key (`antdt
    blocklist allow HOST`) to allow it again sooner."""

    host: Token
    job: Token
    rank: Rank
    action_id: str = Field(min_length=1, max_length=128)
    reason: str = Field(default="", max_length=512)
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
