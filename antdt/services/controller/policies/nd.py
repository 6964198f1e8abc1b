"""The `antdt-nd` policy (AntDT for non-dedicated clusters): ADJUST_BS at once, as
`lb-bsp` decides it, for a rank slow in compute or data; KILL_RESTART for a persistent
straggler when the saving over the remaining run is at least `min_saving_ratio` x the
restart cost and a replacement host exists; a rank whose link is slow is never given a
smaller batch and is moved when that pays (links.py). One action per decision, the worst
straggler first. Work sharing inside a step (`work_sharing`, on by default here) combines
with it: the agents apply it. Rules and parameters: docs/architecture.md, "The
controller" and "Work sharing"."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import cast

from antdt.schemas import Cause, Incident, IncidentKind, IncidentState, JobHealth, StragglerClass
from antdt.schemas.plan import PolicyParam
from antdt.services.controller.actions import Action, KillRestartAction, restart_action_id
from antdt.services.controller.balance import StepModel, median_model
from antdt.services.controller.guardrails import Guardrails, read_param
from antdt.services.controller.policies.judged import (
    judged_models,
    judged_speeds,
    measured_speeds,
)
from antdt.services.controller.policies.lbbsp import LbBspPolicy
from antdt.services.controller.policies.links import RestartCost, decide_link_move
from antdt.services.controller.policies.restart_bound import restart_bound
from antdt.services.controller.policies.targets import (
    Target,
    balanced_target,
    healed_target,
    proportional_target,
)
from antdt.services.controller.view import JobView


@dataclass(frozen=True)
class NdParams:
    rails: Guardrails
    restart_cost_s: float = 30.0
    min_saving_ratio: float = 2.0
    host_pool: tuple[str, ...] = ()
    #: Steps that must be left for a restart: over fewer, its estimated saving is within
    #: the noise of the estimate (two detector windows of the default 8 steps).
    min_steps_left: int = 16

    @classmethod
    def from_params(cls, params: Mapping[str, PolicyParam]) -> NdParams:
        pool = read_param(params, "host_pool", "")
        nd = cls(
            rails=Guardrails.from_params(params),
            restart_cost_s=read_param(params, "restart_cost_s", cls.restart_cost_s),
            min_saving_ratio=read_param(params, "min_saving_ratio", cls.min_saving_ratio),
            host_pool=tuple(h.strip() for h in pool.split(",") if h.strip()),
            min_steps_left=read_param(params, "min_steps_left", cls.min_steps_left),
        )
        if nd.restart_cost_s < 0 or nd.min_saving_ratio < 0 or nd.min_steps_left < 0:
            raise ValueError("restart_cost_s, min_saving_ratio and min_steps_left must be >= 0")
        return nd


@dataclass(frozen=True)
class RestartEstimate:
    """The cost model's figures for restarting one rank on a healthy host."""

    step_now_s: float
    step_after_s: float
    steps_left: int
    plan_after: tuple[int, ...] | None

    @property
    def saving_s(self) -> float:
        return max(0.0, self.step_now_s - self.step_after_s) * self.steps_left


class AntDtNdPolicy:
    """AntDT-ND: ADJUST_BS at once, KILL_RESTART when it pays."""

    name = "antdt-nd"

    def __init__(self) -> None:
        self._adjust = LbBspPolicy()

    def decide(self, view: JobView, event: JobHealth | Incident) -> list[Action]:
        params = NdParams.from_params(view.spec.policy_params)
        restart = decide_restart(view, event, params)
        # Batches first: until one plan was made for this straggler, a plan that gains
        # goes out instead, and the restart is decided again once it settled (the rails
        # hold both). Later refinements do not hold a restart that still pays.
        if restart is not None and batches_tried(view, event, restart):
            return [restart]
        adjust = [
            replace(action, reason=f"antdt-nd adjust_bs ({action.reason})")
            for action in self._adjust.decide(view, event)
        ]
        if restart is not None:
            return adjust or [restart]
        move = decide_link_move(
            view,
            event,
            params.rails,
            restart_cost(view, params),
            lambda host: replacement_available(view, params, host),
        )
        if isinstance(move, KillRestartAction):
            return [move]
        declined = [] if move is None else [move]
        return [*held_for_spare(view, event, params), *declined, *adjust]


def restart_cost(view: JobView, params: NdParams) -> RestartCost:
    """The measured restart cost, else the configured one."""
    measured = view.restarts.measured_cost_s
    seconds = params.restart_cost_s if measured is None else measured
    return RestartCost(seconds, measured is not None, params.min_saving_ratio)


def batches_tried(view: JobView, event: JobHealth | Incident, restart: KillRestartAction) -> bool:
    """Whether the plan in force was made since the restart's incident opened (the
    controller's and the monitor's clocks, which NTP keeps within well under a second)."""
    incidents = [*view.open_incidents, *([event] if isinstance(event, Incident) else [])]
    opened = [i.opened_at for i in incidents if i.id == restart.incident_id]
    return bool(opened) and view.plan.version > 0 and view.plan.created_at >= min(opened)


def decide_restart(
    view: JobView, event: JobHealth | Incident, params: NdParams
) -> KillRestartAction | None:
    """The KILL_RESTART this view calls for, if any (pure)."""
    rails = params.rails
    if rails.hold_reason(view) is not None or rails.restart_hold_reason(view) is not None:
        return None
    speeds = measured_speeds(view)
    cost = restart_cost(view, params)
    cost_s, measured = cost.seconds, cost.measured
    steps_left = view.remaining_steps
    if steps_left is None or steps_left < params.min_steps_left:
        return None  # every estimate would be None or too short to pay
    stragglers = persistent_stragglers(view, event)
    worse_unclassified = unclassified_ratio(view, event, {i.rank for i in stragglers})
    threshold = params.min_saving_ratio * cost_s
    for incident in stragglers:
        if incident.ratio < worse_unclassified:
            return None  # worst first: every later one is milder still
        host = view.hosts.get(incident.rank, incident.host)
        if not replacement_available(view, params, host):
            continue
        if not _may_pay(view, incident, (steps_left, threshold), speeds):
            continue
        estimate = estimate_restart(view, incident.rank, speeds, incident)
        if estimate is None or estimate.saving_s <= 0:
            continue
        if estimate.saving_s < threshold:
            continue
        return KillRestartAction(
            action_id=restart_action_id(view),
            rank=incident.rank,
            host=host,
            reason=_reason(incident, host, estimate, params, cost_s, measured),
            incident_id=incident.id,
            local_batch_after=estimate.plan_after,
            expected_saving_s=estimate.saving_s,
            restart_cost_s=cost_s,
        )
    return None


def _may_pay(
    view: JobView,
    incident: Incident,
    steps_and_threshold: tuple[int, float],
    speeds: Sequence[float | None],
) -> bool:
    """False only when `estimate_restart` would surely say the restart does not pay:
    the measured saving over the steps left is under the threshold (seconds) and the
    model's is 0 (`RestartBound`, made once per view, for the first straggler that
    needs it)."""
    steps_left, threshold = steps_and_threshold
    before = incident.evidence.get("step_s_before")
    if before is not None and view.health is not None:
        measured = (view.health.step_s - before) * steps_left
        if measured > 0 and measured >= threshold:
            return True
    bound = view.remembered("restart_bound", None, lambda: restart_bound(view, speeds))
    return bound is None or bound.model_may_save(incident.rank)


def persistent_stragglers(view: JobView, event: JobHealth | Incident) -> list[Incident]:
    """Open persistent SLOW incidents about the host each rank runs on now, worst first,
    but those of a slow link (links.py). An incident about a host the rank has left (an
    earlier restart) does not count."""
    found = _open_slow(view, event, (StragglerClass.PERSISTENT,))
    return sorted(found, key=lambda i: (-i.ratio, i.rank))


def unclassified_ratio(
    view: JobView, event: JobHealth | Incident, besides: AbstractSet[int] = frozenset()
) -> float:
    """The highest ratio among open SLOW incidents not classified yet (transient or
    unknown: they may still turn persistent) of ranks other than `besides`, about the
    host each rank runs on now; 0 when there is none."""
    classes = (StragglerClass.TRANSIENT, StragglerClass.UNKNOWN)
    found = _open_slow(view, event, classes)
    return max((i.ratio for i in found if i.rank not in besides), default=0.0)


def _open_slow(
    view: JobView, event: JobHealth | Incident, classes: tuple[StragglerClass, ...]
) -> list[Incident]:
    """The open SLOW incidents of `classes` but a slow link's, about the host each rank
    runs on now (the view's, with `event` when it is one), in the view's order."""
    by_class = view.remembered("open_slow", event, lambda: _open_slow_by_class(view, event))
    if len(classes) == 1:
        return by_class.get(classes[0], [])
    return [i for i in by_class.get(None, []) if i.straggler_class in classes]


def _open_slow_by_class(
    view: JobView, event: JobHealth | Incident
) -> dict[StragglerClass | None, list[Incident]]:
    """`_open_slow`'s incidents, by class, and all of them under None: one pass a view
    (a crowd is thousands of incidents, read by several questions a decision)."""
    incidents = {i.id: i for i in view.open_incidents}
    if isinstance(event, Incident):
        incidents[event.id] = event
    world, hosts = view.spec.world_size, view.hosts
    # Locals: an enum member read off its class costs ~0.1 us, thousands of times here.
    slow, resolved, link = IncidentKind.SLOW, IncidentState.RESOLVED, Cause.COMMUNICATION
    found = [
        i
        for i in incidents.values()
        if i.kind == slow
        and i.state != resolved
        and i.cause != link
        and 0 <= i.rank < world
        and hosts.get(i.rank, i.host) == i.host
    ]
    by_class: dict[StragglerClass | None, list[Incident]] = {None: found}
    for incident in found:
        by_class.setdefault(incident.straggler_class, []).append(incident)
    return by_class


def held_for_spare(
    view: JobView, event: JobHealth | Incident, params: NdParams
) -> list[KillRestartAction]:
    """The KILL_RESTART that would pay but has no free spare node to go to, as a one-item
    list (else empty): the executor refuses it and records why (`restarts.no_spare`), so
    that the hold shows in the action log; batches are still adjusted."""
    if not view.nodes or view.free_spares:
        return []
    anywhere = replace(view, nodes={})  # as if a replacement were found
    restart = decide_restart(anywhere, event, replace(params, host_pool=()))
    return [restart] if restart is not None else []


def replacement_available(view: JobView, params: NdParams, host: str) -> bool:
    """A host to move the rank to. Nodes registered by torchrun's rendezvous gate: a free
    spare among them (`JobView.free_spares`). Else one of the pool that no rank uses and
    nobody blocklisted; without a pool the launcher or scheduler is trusted to find one
    (`antdt launch` keeps spare slots)."""
    if view.nodes:
        return any(spare != host for spare in view.free_spares)
    if not params.host_pool:
        return True
    in_use = view.remembered("hosts_in_use", None, lambda: frozenset(view.hosts.values()))
    return any(h not in in_use and h != host and h not in view.blocklist for h in params.host_pool)


def estimate_restart(
    view: JobView, rank: int, speeds: Sequence[float | None], incident: Incident | None = None
) -> RestartEstimate | None:
    """The model's estimate (`estimate_by_model`), or the measured one when it saves more:
    the job's step time now against the incident's before the onset (`step_s_before`).
    Models see compute only; a starved rank also slows everyone's exchange."""
    estimate = estimate_by_model(view, rank, speeds)
    before = None if incident is None else incident.evidence.get("step_s_before")
    if estimate is None or before is None or view.health is None:
        return estimate
    measured = replace(estimate, step_now_s=view.health.step_s, step_after_s=before)
    return measured if measured.saving_s > estimate.saving_s else estimate


def estimate_by_model(
    view: JobView, rank: int, speeds: Sequence[float | None]
) -> RestartEstimate | None:
    """Step times now and with `rank` as fast as the typical other rank, both under the
    best batch plan; None when speeds or the remaining length are unknown. Speeds and
    models are taken as the detector judges them (`judged_speeds`, `judged_models`)."""
    steps_left = view.remaining_steps
    if steps_left is None or not 0 <= rank < len(speeds) or speeds[rank] is None:
        return None
    models = judged_models(view, speeds, deviating={rank})
    if models is None:
        now, after = _healed_by_speed(view, rank, speeds)
    else:
        now, after = _healed_by_model(view, rank, models)
    if now is None or after is None:
        return None
    plan_after = after.plan if after.plan != tuple(view.plan.local_batch) else None
    return RestartEstimate(now.planned_step_s, after.planned_step_s, steps_left, plan_after)


def _healed_by_speed(
    view: JobView, rank: int, speeds: Sequence[float | None]
) -> tuple[Target | None, Target | None]:
    """Best plans by per-sample speed: now, and with `rank` at the others' median."""
    judged = judged_speeds(view, speeds, deviating={rank})
    others = [s for r, s in enumerate(judged) if r != rank and s is not None]
    own = judged[rank]
    if own is None or not others:
        return None, None
    healed = list(judged)
    healed[rank] = max(own, statistics.median(others))
    return proportional_target(view, judged), proportional_target(view, healed)


def _healed_by_model(
    view: JobView, rank: int, models: Sequence[StepModel | None]
) -> tuple[Target | None, Target | None]:
    """Best plans by step-time model: now, and with `rank` given the others' median
    model (or its own, if that predicts faster at its batch)."""
    rest = list(models)
    del rest[rank]
    others = cast(list[StepModel], rest) if all(rest) else [m for m in rest if m is not None]
    own = models[rank]
    if own is None or not others:
        return None, None
    typical = median_model(others)
    batch = view.plan.local_batch[rank]
    healed = min(own, typical, key=lambda m: m.predict(batch))
    return balanced_target(view, models), healed_target(view, models, rank, healed)


def _reason(
    incident: Incident,
    host: str,
    estimate: RestartEstimate,
    params: NdParams,
    cost_s: float,
    measured: bool,
) -> str:
    source = "measured" if measured else "assumed"
    return (
        f"antdt-nd kill_restart: rank {incident.rank} on {host} persistently "
        f"{incident.ratio:.1f}x slow; saving {estimate.saving_s:.1f}s over "
        f"{estimate.steps_left} steps (step {estimate.step_now_s * 1e3:.1f} ms -> "
        f"{estimate.step_after_s * 1e3:.1f} ms) >= {params.min_saving_ratio:g} x "
        f"{source} restart cost {cost_s:.1f}s"
    )
