"""The `lb-bsp` policy (LB-BSP, SoCC'20): per-rank batches right-sized at iteration
barriers, the global batch kept. Variant `cpu`: batches proportional to the speeds as the
detector judges them, in one bounded move; `gpu`: move a step of samples from the slowest
rank to the fastest with spare memory, halving the step when the direction reverses.
Rules and parameters: docs/architecture.md, "The lb-bsp policy"."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from antdt.schemas import Incident, IncidentKind, IncidentState, JobHealth, RankState
from antdt.schemas.plan import PolicyParam
from antdt.services.controller.actions import Action, AdjustBatchAction, plan_action_id
from antdt.services.controller.guardrails import (
    Guardrails,
    batch_bounds,
    read_param,
    within_bounds,
)
from antdt.services.controller.plans import (
    bounded_change,
    predicted_step_time,
    proportional_shares,
)
from antdt.services.controller.view import JobView

_ACTIONABLE = (IncidentKind.SLOW, IncidentKind.LEADER)


@dataclass(frozen=True)
class LbBspParams:
    variant: str
    rails: Guardrails
    step: int

    @classmethod
    def from_params(cls, params: Mapping[str, PolicyParam]) -> LbBspParams:
        variant = read_param(params, "variant", "cpu")
        if variant not in ("cpu", "gpu"):
            raise ValueError(f"policy param variant={variant!r}: expected 'cpu' or 'gpu'")
        step = read_param(params, "step", 0)
        if step < 0:
            raise ValueError("policy param step must be >= 0")
        return cls(variant, Guardrails.from_params(params), step)


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
        self._gpu: dict[str, _GpuMemory] = {}

    def decide(self, view: JobView, event: JobHealth | Incident) -> list[Action]:
        if isinstance(event, Incident) and not _actionable(event):
            return []
        params = LbBspParams.from_params(view.spec.policy_params)
        if params.rails.hold_reason(view) is not None:
            return []
        if isinstance(event, JobHealth) and not _mitigation_wanted(view):
            return []
        speeds = measured_speeds(view)
        if sum(1 for s in speeds if s is not None) < 2:
            return []  # nothing to balance against
        if params.variant == "gpu":
            proposal = self._gpu_move(view, params, speeds)
        else:
            proposal = _proportional(view, params, judged_speeds(view, speeds, deviating=set()))
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
        self._gpu[view.spec.job] = _GpuMemory(
            view.plan.version, last, _Direction(slowest, fastest, step)
        )
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


def measured_speeds(view: JobView) -> tuple[float | None, ...]:
    """Per-rank compute speed (samples/s) from health; None where unknown or stalled."""
    speeds: list[float | None] = [None] * view.spec.world_size
    assert view.health is not None
    for rank in view.health.ranks:
        usable = rank.state in (RankState.OK, RankState.SLOW, RankState.LEADER)
        if usable and rank.samples_per_s > 0 and rank.rank < len(speeds):
            speeds[rank.rank] = rank.samples_per_s
    return tuple(speeds)


def judged_speeds(
    view: JobView, speeds: Sequence[float | None], deviating: set[int]
) -> list[float | None]:
    """Measured speeds, except that a rank the detector does not hold deviating (no open
    SLOW or LEADER incident, not in `deviating`) counts as typical, the median of such
    ranks: their differences are within the detector's noise band, and a plan built on
    them would outlive the straggler it was for."""
    held = deviating | {
        i.rank
        for i in view.open_incidents
        if i.kind in (IncidentKind.SLOW, IncidentKind.LEADER) and i.state != IncidentState.RESOLVED
    }
    normal = [s for r, s in enumerate(speeds) if s is not None and r not in held]
    if not normal:
        return list(speeds)
    typical = statistics.median(normal)
    return [s if s is None or r in held else typical for r, s in enumerate(speeds)]


def _proportional(
    view: JobView, params: LbBspParams, speeds: Sequence[float | None]
) -> tuple[tuple[int, ...], str] | None:
    """CPU variant: shares proportional to speed among ranks of known speed."""
    current = view.plan.local_batch
    lower, upper = batch_bounds(view)
    known = [r for r, s in enumerate(speeds) if s is not None]
    kept = sum(b for r, b in enumerate(current) if r not in known)
    try:
        shares = proportional_shares(
            view.spec.global_batch - kept,
            [_speed(speeds, r) for r in known],
            min_b=view.spec.min_local_batch,
            caps={i: upper[r] for i, r in enumerate(known)},
        )
    except ValueError:
        return None  # no plan within the bounds: leave the job as it is
    target = list(current)
    for i, r in enumerate(known):
        target[r] = shares[i]
    proposal = bounded_change(current, target, params.rails.max_change)
    if not within_bounds(proposal, lower, upper):
        proposal = tuple(target)  # the current plan broke a new cap: fix it at once
    known_speeds = [_speed(speeds, r) for r in known]
    before = predicted_step_time([current[r] for r in known], known_speeds)
    after = predicted_step_time([proposal[r] for r in known], known_speeds)
    must_fix = not within_bounds(current, lower, upper)
    if proposal == tuple(current) or not (must_fix or params.rails.worth_it(before, after)):
        return None
    reason = (
        f"lb-bsp cpu: batches proportional to compute speed; "
        f"predicted step {before * 1e3:.1f} ms -> {after * 1e3:.1f} ms"
    )
    return proposal, reason


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
    if any(_actionable(incident) for incident in view.open_incidents):
        return True
    if not within_bounds(view.plan.local_batch, *batch_bounds(view)):
        return True  # a newly reported memory cap must be honoured at once
    return tuple(view.plan.local_batch) != view.spec.equal_shares()


def _actionable(incident: Incident) -> bool:
    return incident.kind in _ACTIONABLE and incident.state != IncidentState.RESOLVED


def _incident_id(view: JobView, event: JobHealth | Incident) -> str | None:
    """The incident the action answers, for tracing: the event, else an open one."""
    if isinstance(event, Incident):
        return event.id
    for kind in _ACTIONABLE:
        for incident in view.open_incidents:
            if incident.kind == kind:
                return incident.id
    return None
