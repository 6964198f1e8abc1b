"""What a decision asks the executor to do. Pure values; `kind` names the executor's
handler and the ActionRecord's kind. Action ids are deterministic for one view, so a
decision repeated after a takeover is recognised as the same action."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import ClassVar

from antdt.schemas import ActionResult
from antdt.services.controller.view import JobView

#: An action id's length at most (schemas.commands.ActionId).
MAX_ACTION_ID = 128


@dataclass(frozen=True)
class AdjustBatchAction:
    """ADJUST_BS: new per-rank batches (id `{job}-plan-{version}`); the executor builds
    the plan. `micro_batch`/`accumulation` as in `Plan` (None: one pass per step);
    `source`: who decided, when not the job's policy (a custom policy)."""

    kind: ClassVar[str] = "adjust_batch"

    action_id: str
    local_batch: tuple[int, ...]
    reason: str
    incident_id: str | None = None
    micro_batch: tuple[int, ...] | None = None
    accumulation: tuple[int, ...] | None = None
    source: str | None = None


@dataclass(frozen=True)
class KillRestartAction:
    """KILL_RESTART: checkpoint, restart with `rank` moved off `host` (id
    `{job}-restart-{n}`). `local_batch_after`: the plan from the checkpoint on (None:
    unchanged); the saving and cost are the cost model's figures, for the record."""

    kind: ClassVar[str] = "kill_restart"

    action_id: str
    rank: int
    host: str
    reason: str
    incident_id: str | None = None
    local_batch_after: tuple[int, ...] | None = None
    expected_saving_s: float = 0.0
    restart_cost_s: float = 0.0


@dataclass(frozen=True)
class RestartDeclined:
    """A KILL_RESTART the policy weighed for an incident and did not decide, and why: the
    executor records it (result refused) and does nothing else. Its id names the incident
    and its state, so the record is written once per transition."""

    kind: ClassVar[str] = "kill_restart"

    action_id: str
    rank: int
    host: str
    reason: str
    incident_id: str | None = None


#: Every action a policy may return (the executor has one handler per member).
Action = AdjustBatchAction | KillRestartAction | RestartDeclined


def job_action_id(job: str, what: str) -> str:
    """`{job}-{what}`: an action id, within its 128 characters. A job's id may take 128
    itself: past them, the job's first 80 and a digest of the whole (ANTDT_ACTIONS
    de-duplicates by id across jobs: two long ids alike in their first 80 stay apart)."""
    action_id = f"{job}-{what}"
    if len(action_id) <= MAX_ACTION_ID:
        return action_id
    return f"{job[:80]}-{hashlib.sha256(job.encode()).hexdigest()[:24]}-{what}"


def plan_action_id(view: JobView) -> str:
    """The id of the plan that would follow the view's current one."""
    return plan_version_action_id(view.spec.job, view.plan.version + 1)


def plan_version_action_id(job: str, version: int) -> str:
    """The id of the ADJUST_BS that writes plan `version` of `job`."""
    return job_action_id(job, f"plan-{version}")


def declined_action_id(incident_id: str, state: str) -> str:
    """The id of a restart declined for an incident in `state`."""
    return f"{incident_id[:100]}-declined-{state}"


def unsent_action_id(action_id: str, result: ActionResult, at: float) -> str:
    """The id of the record of an action refused, or failed before anything was sent,
    at `at`: ANTDT_ACTIONS de-duplicates by id, and the same action may yet be carried
    out under its own (a plan version or a restart number not spent)."""
    outcome = "refused" if result is ActionResult.REFUSED else "failed"
    return f"{action_id[:100]}-{outcome}-{at:.6f}"


def restart_action_id(view: JobView) -> str:
    """The id of the restart that would follow the view's restart history."""
    return job_action_id(view.spec.job, f"restart-{view.restarts.count + 1}")
