"""antdt-nd's answer to a slow link: an open SLOW incident whose cause is communication
(`judged.link_bound`). No batch plan helps a link, so the node is moved (KILL_RESTART)
when the saving pays for the restart: (the job's step time now - its step time before
the onset) x the steps left >= min_saving_ratio x the restart cost. When it does not,
the reason is recorded (RestartDeclined), once per transition of the incident. Pure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from antdt.schemas import Incident, JobHealth, StragglerClass
from antdt.services.controller.actions import (
    KillRestartAction,
    RestartDeclined,
    declined_action_id,
    restart_action_id,
)
from antdt.services.controller.guardrails import Guardrails
from antdt.services.controller.policies.judged import link_bound
from antdt.services.controller.view import JobView

#: Classes that say the link stays slow: persistent, or slow since the rank started.
_SETTLED = (StragglerClass.PERSISTENT, StragglerClass.DETERMINISTIC)


@dataclass(frozen=True)
class RestartCost:
    """What a restart costs the job, seconds, and whether it was measured (or assumed)."""

    seconds: float
    measured: bool
    min_saving_ratio: float


@dataclass(frozen=True)
class LinkMove:
    """The figures of moving a rank off a slow link: the job's step time now (health) and
    before the onset (the incident's `step_s_before`), and the steps left."""

    step_now_s: float
    step_before_s: float
    steps_left: int

    @property
    def saving_s(self) -> float:
        return max(0.0, self.step_now_s - self.step_before_s) * self.steps_left


def decide_link_move(
    view: JobView,
    event: JobHealth | Incident,
    rails: Guardrails,
    cost: RestartCost,
    has_replacement: Callable[[str], bool],
) -> KillRestartAction | RestartDeclined | None:
    """The KILL_RESTART of the first link-bound rank whose move pays; else, when `event`
    is the transition of a link-bound incident, why it is not moved; else None."""
    if rails.hold_reason(view) is not None:
        return None
    budget_used = view.restarts.count >= rails.restart_budget
    if not budget_used and rails.restart_hold_reason(view) is not None:
        return None  # in flight or cooling down: decided again later
    for incident in link_stragglers(view, event):
        host = view.hosts.get(incident.rank, incident.host)
        move = estimate_move(view, incident)
        why = _why_not(view, rails, cost, move, has_replacement(host))
        if why is None and move is not None:
            return KillRestartAction(
                action_id=restart_action_id(view),
                rank=incident.rank,
                host=host,
                reason=f"antdt-nd kill_restart: {_about(incident, host)}; {_paying(move, cost)}",
                incident_id=incident.id,
                expected_saving_s=move.saving_s,
                restart_cost_s=cost.seconds,
            )
        if isinstance(event, Incident) and event.id == incident.id:
            return RestartDeclined(
                action_id=declined_action_id(incident.id, incident.state.value),
                rank=incident.rank,
                host=host,
                reason=f"antdt-nd no kill_restart: {_about(incident, host)}; {why}",
                incident_id=incident.id,
            )
    return None


def link_stragglers(view: JobView, event: JobHealth | Incident) -> list[Incident]:
    """Open link-bound incidents known to last (persistent or deterministic), about the
    host each rank runs on now; the slowest round trip first."""
    incidents = {i.id: i for i in view.open_incidents}
    if isinstance(event, Incident):
        incidents[event.id] = event
    found = [
        i
        for i in incidents.values()
        if link_bound(i)
        and i.straggler_class in _SETTLED
        and 0 <= i.rank < view.spec.world_size
        and view.hosts.get(i.rank, i.host) == i.host
    ]
    return sorted(found, key=lambda i: (-i.evidence.get("link_rtt_s", 0.0), i.rank))


def estimate_move(view: JobView, incident: Incident) -> LinkMove | None:
    """None when the step time before the onset, now, or the steps left are unknown."""
    before = incident.evidence.get("step_s_before")
    steps_left = view.remaining_steps
    if before is None or steps_left is None or view.health is None:
        return None
    return LinkMove(view.health.step_s, before, steps_left)


def _why_not(
    view: JobView,
    rails: Guardrails,
    cost: RestartCost,
    move: LinkMove | None,
    replacement: bool,
) -> str | None:
    """Why the move is not decided (None: it is)."""
    if view.restarts.count >= rails.restart_budget:
        return f"restart budget used ({view.restarts.count} of {rails.restart_budget})"
    if not replacement:
        return "no free spare node to move it to"
    if move is None:
        return "its step time before the onset or the steps left are unknown"
    if move.saving_s <= 0 or move.saving_s < cost.min_saving_ratio * cost.seconds:
        return f"it does not pay: {_paying(move, cost, '<')}"
    return None


def _about(incident: Incident, host: str) -> str:
    rtt = incident.evidence.get("link_rtt_s")
    others = incident.evidence.get("others_link_rtt_s")
    if rtt is None or others is None:
        return f"rank {incident.rank} on {host}: its link is slow"
    return (
        f"rank {incident.rank} on {host}: its link is slow (round trip "
        f"{rtt * 1e3:.1f} ms, the other ranks' {others * 1e3:.1f} ms)"
    )


def _paying(move: LinkMove, cost: RestartCost, compare: str = ">=") -> str:
    source = "measured" if cost.measured else "assumed"
    return (
        f"saving {move.saving_s:.1f}s over {move.steps_left} steps (step "
        f"{move.step_now_s * 1e3:.1f} ms now, {move.step_before_s * 1e3:.1f} ms before the "
        f"onset) {compare} {cost.min_saving_ratio:g} x {source} restart cost {cost.seconds:.1f}s"
    )


__all__ = ["LinkMove", "RestartCost", "decide_link_move", "estimate_move", "link_stragglers"]
