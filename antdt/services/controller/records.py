"""The ActionRecords the executor publishes on ANTDT_ACTIONS, built from values. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from antdt.schemas import ActionRecord, ActionResult, JobSpec, Plan
from antdt.services.controller.actions import AdjustBatchAction, KillRestartAction


def missing(spec: JobSpec, acked: Sequence[int]) -> tuple[int, ...]:
    return tuple(r for r in range(spec.world_size) if r not in acked)


def adjust_record(
    spec: JobSpec,
    action: AdjustBatchAction,
    result: ActionResult,
    *,
    decided_at: float,
    completed_at: float,
    plan: Plan | None = None,
    acked: Sequence[int] = (),
    error: str | None = None,
) -> ActionRecord:
    """An ADJUST_BS; `plan` None: it was refused or failed before a plan was written."""
    return ActionRecord(
        action_id=action.action_id,
        job=spec.job,
        kind=action.kind,
        policy=(action.source or spec.policy)[:64],
        reason=action.reason[:1024],
        incident_id=action.incident_id,
        plan_version=plan.version if plan else None,
        local_batch=plan.local_batch if plan else action.local_batch,
        micro_batch=action.micro_batch,
        accumulation=action.accumulation,
        effective_step=plan.effective_step if plan else None,
        decided_at=decided_at,
        completed_at=completed_at,
        result=result,
        acked_ranks=tuple(acked),
        missing_ranks=missing(spec, acked) if plan else (),
        error=error,
    )


def resent_plan_record(
    spec: JobSpec,
    plan: Plan,
    action_id: str,
    result: ActionResult,
    acked: Sequence[int],
    *,
    completed_at: float,
) -> ActionRecord:
    """The record of a plan a dead owner wrote but never recorded, sent again."""
    return ActionRecord(
        action_id=action_id,
        job=spec.job,
        kind=AdjustBatchAction.kind,
        policy=spec.policy,
        reason=f"{plan.reason} (recorded after a takeover)"[:1024],
        plan_version=plan.version,
        local_batch=plan.local_batch,
        effective_step=plan.effective_step,
        decided_at=plan.created_at,
        completed_at=completed_at,
        result=result,
        acked_ranks=tuple(acked),
        missing_ranks=missing(spec, acked),
    )


def restart_record(
    spec: JobSpec,
    action_id: str,
    reason: str,
    result: ActionResult,
    *,
    rank: int,
    host: str,
    incident_id: str | None,
    decided_at: float,
    completed_at: float,
    step: int | None = None,
    acked: Sequence[int] = (),
    error: str | None = None,
) -> ActionRecord:
    """A KILL_RESTART; `step` None: it was never sent (refused, or nothing written)."""
    return ActionRecord(
        action_id=action_id,
        job=spec.job,
        kind=KillRestartAction.kind,
        policy=spec.policy,
        reason=reason[:1024],
        incident_id=incident_id,
        effective_step=step,
        rank=rank,
        host=host[:128],
        decided_at=decided_at,
        completed_at=completed_at,
        result=result,
        acked_ranks=tuple(acked),
        missing_ranks=missing(spec, acked) if step is not None else (),
        error=error,
    )
