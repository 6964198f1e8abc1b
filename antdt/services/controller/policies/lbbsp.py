"""The `lb-bsp` policy (LB-BSP, SoCC'20): per-rank batches right-sized at iteration
barriers, the global batch kept. Variant `cpu`: the plan that equalises the ranks'
predicted step times under the monitor's step-time models (per-sample speeds while it
reports none), in one bounded move; `gpu`: move a step of samples from the slowest rank to
the fastest with spare memory, halving the step when the direction reverses.
A rank whose link is slow keeps its batch: no plan helps a link.
Rules and parameters: docs/architecture.md, "The lb-bsp policy"."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from antdt.schemas import Incident, IncidentKind, JobHealth
from antdt.schemas.plan import PolicyParam
from antdt.services.controller.actions import Action, AdjustBatchAction, plan_action_id
from antdt.services.controller.guardrails import (
    Guardrails,
    batch_bounds,
    read_param,
    within_bounds,
)
from antdt.services.controller.plans import bounded_change
from antdt.services.controller.policies.incident_facts import facts_of, incident_facts
from antdt.services.controller.policies.judged import (
    judged_models,
    judged_speeds,
    measured_speeds,
    without_link_bound,
)
from antdt.services.controller.policies.targets import balanced_target, proportional_target
from antdt.services.controller.view import JobView

_ACTIONABLE = (IncidentKind.SLOW, IncidentKind.LEADER)

#: Jobs whose last GPU-variant moves the policy remembers, at most (one policy object
#: serves every job of a controller for its whole life).
MAX_JOBS = 4096


@dataclass(frozen=True)
class LbBspParams:
    variant: str
    rails: Guardrails
    step: int
    fit_steps: int = 16  # steps at a new batch or speed before its models are trusted
    fit_wait_steps: int = 64  # steps after a switch the job waits on young slow runs

    @classmethod
    def from_params(cls, params: Mapping[str, PolicyParam]) -> LbBspParams:
        variant = read_param(params, "variant", "cpu")
        if variant not in ("cpu", "gpu"):
            raise ValueError(f"policy param variant={variant!r}: expected 'cpu' or 'gpu'")
        step = read_param(params, "step", 0)
        fit_steps = read_param(params, "fit_steps", cls.fit_steps)
        fit_wait = read_param(params, "fit_wait_steps", cls.fit_wait_steps)
        if step < 0 or fit_steps < 0 or fit_wait < 0:
            raise ValueError("policy params step, fit_steps and fit_wait_steps must be >= 0")
        return cls(variant, Guardrails.from_params(params), step, fit_steps, fit_wait)


@dataclass(frozen=True)
class _Direction:
    """The last GPU move: samples went from `source` to `target`, `step` at a time."""

    source: int | None = None
    target: int | None = None
    step: int | None = None


@dataclass(frozen=True)
class _GpuMemory:
    """The GPU variant's memory of one job, tied to the plan version it decided on: the
    same version again starts from `before` (the same view, the same action), the next
    one (our move applied) from `after`, any other afresh."""

    base_version: int
    before: _Direction
    after: _Direction


class LbBspPolicy:
    """LB-BSP batch rebalancing (variants and parameters: the module docstring)."""

    name = "lb-bsp"

    def __init__(self) -> None:
        # The only state: the GPU variant's last direction and step, per job. Clock-free
        # and keyed by plan version, so decisions stay deterministic (see _GpuMemory).
        self._gpu: OrderedDict[str, _GpuMemory] = OrderedDict()  # per job: its last moves

    def decide(self, view: JobView, event: JobHealth | Incident) -> list[Action]:
        if isinstance(event, Incident) and not facts_of((event,)).actionable:
            return []
        params = LbBspParams.from_params(view.spec.policy_params)
        if params.rails.hold_reason(view) is not None:
            return []
        if isinstance(event, JobHealth) and not _mitigation_wanted(view):
            return []
        speeds = without_link_bound(view, measured_speeds(view), event)
        if len(speeds) - speeds.count(None) < 2:
            return []  # nothing to balance against
        if params.variant == "gpu":
            proposal = self._gpu_move(view, params, speeds)
        else:
            proposal = _cpu_plan(view, params, speeds)
        if proposal is None:
            return []
        local_batch, reason = proposal
        return [
            AdjustBatchAction(
                action_id=plan_action_id(view),
                local_batch=local_batch,
                reason=reason,
                incident_id=_incident_id(view, event),
            )
        ]

    # ------------------------------------------------------------------ gpu variant

    def _gpu_move(
        self, view: JobView, params: LbBspParams, speeds: Sequence[float | None]
    ) -> tuple[tuple[int, ...], str] | None:
        plan = list(view.plan.local_batch)
        lower, upper = batch_bounds(view)
        known = [r for r, s in enumerate(speeds) if s is not None]
        times = {r: plan[r] / _speed(speeds, r) for r in known}
        slowest = max(known, key=lambda r: (times[r], -r))
        spare = [r for r in known if r != slowest and plan[r] < upper[r]]
        if not spare or plan[slowest] <= lower[slowest]:
            return None
        fastest = min(spare, key=lambda r: (times[r], r))
        if times[fastest] > times[slowest] * (1.0 - params.rails.min_gain):
            return None  # balanced within the hysteresis band
        last = self._last_direction(view)
        step = _next_step(
            last, slowest, params.step or max(1, view.spec.global_batch // (4 * len(plan)))
        )
        amount = min(step, plan[slowest] - lower[slowest], upper[fastest] - plan[fastest])
        # Never create a new bottleneck: the receiver must stay faster than the giver was.
        receiver_speed = _speed(speeds, fastest)
        while amount > 0 and (plan[fastest] + amount) / receiver_speed >= times[slowest]:
            amount //= 2
        if amount <= 0:
            return None
        plan[slowest] -= amount
        plan[fastest] += amount
        moved = _GpuMemory(view.plan.version, last, _Direction(slowest, fastest, step))
        self._gpu[view.spec.job] = moved
        self._gpu.move_to_end(view.spec.job)
        if len(self._gpu) > MAX_JOBS:  # the least recently moved job's is forgotten
            self._gpu.popitem(last=False)
        reason = f"lb-bsp gpu: move {amount} samples from rank {slowest} to rank {fastest}"
        return tuple(plan), reason

    def _last_direction(self, view: JobView) -> _Direction:
        memory = self._gpu.get(view.spec.job)
        if memory is None:
            return _Direction()
        if memory.base_version == view.plan.version:
            return memory.before
        if memory.base_version + 1 == view.plan.version:
            return memory.after
        return _Direction()


def _cpu_plan(
    view: JobView, params: LbBspParams, speeds: Sequence[float | None]
) -> tuple[tuple[int, ...], str] | None:
    """CPU variant: the plan balancing the ranks' step-time models as judged, or shares
    proportional to the judged speeds while the monitor reports no model; one move
    towards it within `max_change`, taken only when the predicted step time drops by
    `min_gain` or the current plan breaks a bound."""
    current = tuple(view.plan.local_batch)
    must_fix = not within_bounds(current, *batch_bounds(view))
    models = judged_models(view, speeds, deviating=set())
    if models is None:
        target = proportional_target(view, judged_speeds(view, speeds, deviating=set()))
    else:
        young = frozenset() if must_fix else _young_runs(view, params)
        if young is None:
            return None
        if young:
            models = [None if rank in young else m for rank, m in enumerate(models)]
        target = balanced_target(view, models)
    if target is None:
        return None  # no plan within the bounds: leave the job as it is
    # Each rank's proposal lies between its batch now and the target's, both within the
    # bounds unless the current plan broke a new cap.
    proposal = bounded_change(current, target.plan, params.rails.max_change)
    if must_fix and not within_bounds(proposal, *batch_bounds(view)):
        proposal = target.plan  # the current plan broke a new cap: fix it at once
    before, after = target.step_s(current), target.step_s(proposal)
    if proposal == current or not (must_fix or params.rails.worth_it(before, after)):
        return None
    reason = (
        f"lb-bsp cpu: {target.how}; predicted step {before * 1e3:.1f} ms -> {after * 1e3:.1f} ms"
    )
    return proposal, reason


def _young_runs(view: JobView, params: LbBspParams) -> frozenset[int] | None:
    """The ranks to plan as of unknown speed (they keep their batch), or None while no
    plan may come: the models may lack `fit_steps` steps of a rank at its batch and speed.
    After a switch every rank's batch changed: the job waits. After a held incident's
    slow run began (its `step` less its `slow_for_steps`: the monitor restarts the rank's
    history there) the job waits too, but only `fit_wait_steps` past the plan's effective
    step: at 10,000 ranks some rank turns slow every step or two and a job-wide wait
    never ended. Past it, the ranks whose run is still young keep their batch."""
    assert view.health is not None
    step = view.health.step
    since = view.plan.effective_step if view.plan.version > 0 else 0
    if step < since + params.fit_steps:
        return None
    facts = incident_facts(view)
    if step >= facts.latest_run_began + params.fit_steps:
        return frozenset()
    if step < since + params.fit_wait_steps:
        return None
    return facts.runs_began_after(step - params.fit_steps)


def _next_step(last: _Direction, source: int, initial: int) -> int:
    """Halve the step when the direction reverses; restart when the straggler changed."""
    if last.step is None:
        return initial
    if last.target == source:
        return max(1, last.step // 2)
    return last.step if last.source == source else initial


def _speed(speeds: Sequence[float | None], rank: int) -> float:
    speed = speeds[rank]
    assert speed is not None
    return speed


def _mitigation_wanted(view: JobView) -> bool:
    """A health tick may re-plan only while the monitor reports a deviating rank, or to
    undo an earlier mitigation (plan not equal shares): a healthy job is left alone, so
    measurement noise on shared cores never moves batches."""
    if incident_facts(view).actionable:
        return True
    if not within_bounds(view.plan.local_batch, *batch_bounds(view)):
        return True  # a newly reported memory cap must be honoured at once
    return tuple(view.plan.local_batch) != view.spec.equal_shares()


def _incident_id(view: JobView, event: JobHealth | Incident) -> str | None:
    """The incident the action answers, for tracing: the event, else an open one."""
    if isinstance(event, Incident):
        return event.id
    actionable = incident_facts(view).actionable
    for kind in _ACTIONABLE:
        for incident in actionable:
            if incident.kind == kind:
                return incident.id
    return None
