"""The `antdt-dd` policy (AntDT for dedicated heterogeneous clusters): batches
proportional to measured speed, micro-batches within each device's memory cap with
gradient accumulation, the global batch kept; one plan, then quiet.
Rules and parameters: docs/architecture.md, "The antdt-dd policy"."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from antdt.schemas import Incident, IncidentState, JobHealth, StragglerClass
from antdt.schemas.plan import PolicyParam
from antdt.services.controller.actions import Action, AdjustBatchAction, plan_action_id
from antdt.services.controller.guardrails import Guardrails, read_param
from antdt.services.controller.plans import (
    accumulation_upper_bounds,
    bounded_change,
    micro_batching,
    plan_violations,
    predicted_step_time,
    proportional_shares,
)
from antdt.services.controller.policies.judged import any_unknown, measured_speeds
from antdt.services.controller.view import JobView

#: dd's own defaults for the shared guardrails (a job's params still override them).
DD_DEFAULTS: dict[str, PolicyParam] = {"max_change": 8.0}
#: How the reason of a plan made before every rank's speed was known begins.
PROVISIONAL = "antdt-dd provisional"


@dataclass(frozen=True)
class DdParams:
    rails: Guardrails
    replan_s: float
    max_accumulation: int

    @classmethod
    def from_params(cls, params: Mapping[str, PolicyParam]) -> DdParams:
        merged = {**DD_DEFAULTS, **params}
        replan_s = read_param(merged, "replan_s", 600.0)
        max_accumulation = read_param(merged, "max_accumulation", 16)
        if replan_s < 0:
            raise ValueError("policy param replan_s must be >= 0")
        if max_accumulation < 1:
            raise ValueError("policy param max_accumulation must be >= 1")
        return cls(Guardrails.from_params(merged), replan_s, max_accumulation)


@dataclass(frozen=True)
class DdPlan:
    local_batch: tuple[int, ...]
    micro_batch: tuple[int, ...]
    accumulation: tuple[int, ...]
    reason: str


class DdPolicy:
    """AntDT-DD: one plan with accumulation, then quiet (the module docstring)."""

    name = "antdt-dd"

    def decide(self, view: JobView, event: JobHealth | Incident) -> list[Action]:
        if not isinstance(event, JobHealth):
            return []
        params = DdParams.from_params(view.spec.policy_params)
        if params.rails.hold_reason(view) is not None:
            return []
        plan = plan_dd(view, params)
        if plan is None:
            return []
        return [
            AdjustBatchAction(
                action_id=plan_action_id(view),
                local_batch=plan.local_batch,
                micro_batch=plan.micro_batch,
                accumulation=plan.accumulation,
                reason=plan.reason,
                incident_id=_deterministic_incident(view),
            )
        ]


def current_violation(view: JobView) -> str:
    """Why the view's current plan breaks the bounds or a memory cap ('' when it does not)."""
    plan = view.plan
    return plan_violations(
        view.spec, view.memory_caps, plan.local_batch, plan.micro_batch, plan.accumulation
    )


def plan_dd(view: JobView, params: DdParams) -> DdPlan | None:
    """The dd plan for this view, or None when the current one should stay. Pure."""
    assert view.health is not None
    spec, current = view.spec, view.plan
    must_fix = current_violation(view)
    ours = current.accumulation is not None and not current.reason.startswith(PROVISIONAL)
    if not must_fix and ours and view.now - current.created_at < params.replan_s:
        return None  # one plan, then quiet (the speeds not even read)
    speeds = measured_speeds(view)
    unknown = any_unknown(view, speeds)
    if not must_fix and unknown:
        return None  # plan from every rank's speed, or not at all
    filled = _filled(speeds, unknown)
    upper = accumulation_upper_bounds(
        spec.world_size,
        spec.global_batch,
        spec.max_local_batch,
        view.memory_caps,
        params.max_accumulation,
    )
    max_change = params.rails.max_change
    try:
        target = proportional_shares(
            spec.global_batch,
            filled,
            min_b=spec.min_local_batch,
            max_b=spec.max_local_batch,
            caps=dict(enumerate(upper)) if view.memory_caps else None,  # else max_b bounds all
        )
        # A broken cap is fixed in one move; otherwise the move is bounded.
        local = target if must_fix else bounded_change(current.local_batch, target, max_change)
        micro, accumulation = micro_batching(local, view.memory_caps, params.max_accumulation)
    except ValueError:
        return None  # no plan within the bounds: leave the job as it is
    now_running = (
        current.local_batch,
        current.micro_batch or current.local_batch,
        current.accumulation or (1,) * spec.world_size,
    )
    if (local, micro, accumulation) == now_running:
        return None
    rates = np.asarray(filled, dtype=np.float64)  # read once for both predictions
    before = predicted_step_time(current.local_batch, rates)
    after = predicted_step_time(local, rates)
    if not must_fix and not params.rails.worth_it(before, after):
        return None
    why = f"fix: {must_fix}; " if must_fix else ""
    missing = [str(r) for r, s in enumerate(speeds) if s is None] if unknown else []
    head = f"{PROVISIONAL} (no speed yet: ranks {','.join(missing)})" if missing else "antdt-dd"
    reason = (
        f"{head}: {why}batches proportional to compute speed, micro-batches within "
        f"memory caps (accumulation up to {max(accumulation)}); predicted step "
        f"{before * 1e3:.1f} ms -> {after * 1e3:.1f} ms"
    )
    return DdPlan(local, micro, accumulation, reason)


def _filled(speeds: Sequence[float | None], unknown: bool) -> list[float]:
    """`speeds` with an unknown one (`unknown`: some is) at the known ones' median (1.0
    when none is known)."""
    if not unknown:
        return cast(list[float], list(speeds))
    known = [s for s in speeds if s is not None]
    fallback = statistics.median(known) if known else 1.0
    return [fallback if s is None else s for s in speeds]


def _deterministic_incident(view: JobView) -> str | None:
    """The hardware incident the plan answers, if the monitor opened one (for tracing)."""
    for incident in view.open_incidents:
        hardware = incident.straggler_class == StragglerClass.DETERMINISTIC
        if hardware and incident.state != IncidentState.RESOLVED:
            return incident.id
    return None
