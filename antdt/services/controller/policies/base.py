"""The policy contract: a pure `decide(view, event) -> list[Action]` (DESIGN.md section 8).

Policies never do I/O and never read the clock: the controller shell builds a read-only
JobView (with `now`) and the executor alone carries actions out, after checking the same
guardrails again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from antdt.schemas import Incident, JobHealth, JobSpec, Plan


@dataclass(frozen=True)
class JobView:
    """What a policy may look at; built by the controller shell for one decision."""

    spec: JobSpec
    plan: Plan
    health: JobHealth | None
    open_incidents: tuple[Incident, ...]
    memory_caps: Mapping[int, int]  # rank -> largest local batch its memory holds
    last_action_at: float | None
    now: float


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


#: Every action a policy may return (KILL_RESTART joins later).
Action = AdjustBatchAction

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
