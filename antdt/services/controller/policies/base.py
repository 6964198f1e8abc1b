"""The policy contract: a pure `decide(view, event) -> list[Action]`.

Policies never do I/O and never read the clock: the controller shell builds a read-only
JobView (with `now`) and the executor alone carries actions out, after checking the same
guardrails again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from antdt.schemas import Incident, JobHealth, JobSpec, Plan, RestartLedger


@dataclass(frozen=True)
class JobView:
    """What a policy may look at; built by the controller shell for one decision.

    The fields after `now` describe restarts (KILL_RESTART); their defaults describe a job
    that never restarted, on hosts nobody blocklisted, of unknown remaining length.
    """

    spec: JobSpec
    plan: Plan
    health: JobHealth | None
    open_incidents: tuple[Incident, ...]
    memory_caps: Mapping[int, int]  # rank -> largest local batch its memory holds
    last_action_at: float | None
    now: float
    #: rank -> host it runs on now (its latest RankHello, else its JobHealth row)
    hosts: Mapping[int, str] = field(default_factory=dict)
    #: hosts no rank may be moved to (etcd `blocklist/{host}`, all jobs)
    blocklist: frozenset[str] = frozenset()
    #: restart budget used, measured costs, the restart in flight (etcd `jobs/{job}/restarts`)
    restarts: RestartLedger = field(default_factory=RestartLedger)
    #: samples left to train (spec: dataset_size x epochs, minus steps done x global batch)
    remaining_samples: int | None = None

    @property
    def remaining_steps(self) -> int | None:
        """Steps left at the current global batch (None: unknown)."""
        if self.remaining_samples is None:
            return None
        return -(-self.remaining_samples // self.spec.global_batch)


def remaining_samples(spec: JobSpec, health: JobHealth | None) -> int | None:
    """Samples the job still has to train after the step health reports (steps count from
    0). An estimate: an epoch's last steps may be short, so it errs towards too few."""
    if health is None:
        return None
    done = (health.step + 1) * spec.global_batch
    return max(0, spec.dataset_size * spec.epochs - done)


@dataclass(frozen=True)
class AdjustBatchAction:
    """Switch the job to new per-rank batch sizes (ADJUST_BS); the executor builds the plan.

    `action_id` is deterministic for one view (f"{job}-plan-{new_version}"), so a decision
    repeated after a controller restart is recognised as the same action.
    """

    action_id: str
    local_batch: tuple[int, ...]
    reason: str
    incident_id: str | None = None
    # Gradient accumulation (antdt-dd): per-rank largest micro-batch and micro-steps, with
    # the relation of `antdt.schemas.plan.check_accumulation`; None: one pass per step.
    micro_batch: tuple[int, ...] | None = None
    accumulation: tuple[int, ...] | None = None
    source: str | None = None  # who decided, when not the job's policy (a custom policy)


@dataclass(frozen=True)
class KillRestartAction:
    """Checkpoint the job, restart it with `rank` moved off `host` (KILL_RESTART).

    `action_id` is deterministic (f"{job}-restart-{n}", n = restarts decided so far + 1).
    `local_batch_after` is the plan for after the restart (the replacement host assumed
    as fast as the median rank), or None to keep the current plan; the executor makes it
    effective at the first step after the checkpoint. `expected_saving_s` and
    `restart_cost_s` are the cost model's figures, for the record.
    """

    action_id: str
    rank: int
    host: str
    reason: str
    incident_id: str | None = None
    local_batch_after: tuple[int, ...] | None = None
    expected_saving_s: float = 0.0
    restart_cost_s: float = 0.0


#: Every action a policy may return.
Action = AdjustBatchAction | KillRestartAction

#: What a decision reacts to: the 1 Hz health or an incident transition.
PolicyEvent = JobHealth | Incident


@runtime_checkable
class Policy(Protocol):
    """A decision core, registered under entry point group `antdt.policies`."""

    name: str

    def decide(self, view: JobView, event: JobHealth | Incident) -> list[Action]: ...


def plan_action_id(view: JobView) -> str:
    """The idempotency key of the plan that would follow the view's current one."""
    return f"{view.spec.job}-plan-{view.plan.version + 1}"


def restart_action_id(view: JobView) -> str:
    """The idempotency key of the restart that would follow the view's restart history."""
    return f"{view.spec.job}-restart-{view.restarts.count + 1}"
