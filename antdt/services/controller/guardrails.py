"""The guardrails every policy applies before it acts, and the executor again: cooldown,
settling under a new plan, hysteresis, per-rank bounds, bounded change, and for restarts
a budget, a cooldown and one in flight at a time. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import le
from typing import TypeVar

from antdt.schemas.plan import PolicyParam
from antdt.services.controller.plans import upper_bounds
from antdt.services.controller.splits import one_value
from antdt.services.controller.view import JobView

T = TypeVar("T", int, float, str, bool)


def read_param(params: Mapping[str, PolicyParam], name: str, default: T) -> T:
    """`params[name]` checked against the default's type; the default when absent."""
    if name not in params:
        return default
    value = params[name]
    expected = type(default)
    # bool is an int to Python, but `max_change: true` is a mistake worth reporting.
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # type: ignore[return-value]
    if type(value) is not expected:
        raise ValueError(
            f"policy param {name}={value!r}: expected {expected.__name__} (default {default!r})"
        )
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class Guardrails:
    cooldown_s: float = 3.0  # the settle-steps rule already waits for post-switch windows
    settle_steps: int = 8  # one detector window: every rank has a post-switch window
    min_gain: float = 0.20  # below this, on shared cores, a re-plan mostly chases noise
    max_change: float = 0.75  # a 3x (even 5x) straggler of 4 is fixed in one move
    restart_budget: int = 2  # KILL_RESTARTs per job
    restart_cooldown_s: float = 60.0  # between two KILL_RESTART decisions
    restart_timeout_s: float = 600.0  # a restart not seen to resume stops blocking then

    @classmethod
    def from_params(cls, params: Mapping[str, PolicyParam]) -> Guardrails:
        rails = cls(
            cooldown_s=read_param(params, "cooldown_s", cls.cooldown_s),
            settle_steps=read_param(params, "settle_steps", cls.settle_steps),
            min_gain=read_param(params, "min_gain", cls.min_gain),
            max_change=read_param(params, "max_change", cls.max_change),
            restart_budget=read_param(params, "restart_budget", cls.restart_budget),
            restart_cooldown_s=read_param(params, "restart_cooldown_s", cls.restart_cooldown_s),
            restart_timeout_s=read_param(params, "restart_timeout_s", cls.restart_timeout_s),
        )
        if rails.cooldown_s < 0 or rails.settle_steps < 0:
            raise ValueError("cooldown_s and settle_steps must be >= 0")
        if not 0 <= rails.min_gain < 1:
            raise ValueError("min_gain must be in [0, 1)")
        if not rails.max_change > 0:
            raise ValueError("max_change must be > 0")
        if rails.restart_budget < 0 or rails.restart_cooldown_s < 0:
            raise ValueError("restart_budget and restart_cooldown_s must be >= 0")
        if not rails.restart_timeout_s > 0:
            raise ValueError("restart_timeout_s must be > 0")
        return rails

    def restart_in_flight(self, view: JobView) -> bool:
        """A restart was decided and the job has not been seen to resume (nor timed out)."""
        pending = view.restarts.pending
        return pending is not None and view.now - pending.decided_at < self.restart_timeout_s

    def restart_hold_reason(self, view: JobView) -> str | None:
        """Why no KILL_RESTART may be decided on this view now (None: it may)."""
        ledger = view.restarts
        if ledger.count >= self.restart_budget:
            return f"restart budget used ({ledger.count} of {self.restart_budget})"
        if self.restart_in_flight(view):
            return "a restart is in flight"
        last = ledger.last_decided_at
        if last is not None and view.now - last < self.restart_cooldown_s:
            return "restart cooling down"
        return None

    def hold_reason(self, view: JobView) -> str | None:
        """Why no policy may act on this view now (None: it may)."""
        if view.health is None:
            return "no health yet"
        if len(view.plan.local_batch) != view.spec.world_size:
            return "plan does not match the job's world size"
        if view.last_action_at is not None and view.now - view.last_action_at < self.cooldown_s:
            return "cooling down"
        if self.restart_in_flight(view):
            return "a restart is in flight"
        resumed = view.restarts.last_checkpoint_step
        if resumed is not None and view.health.step < resumed + 1 + self.settle_steps:
            return "settling after the restart"
        if view.health.plan_version < view.plan.version:
            return "current plan not measured yet"
        if view.health.step < view.plan.effective_step + self.settle_steps:
            return "settling after the plan switch"
        return None

    def worth_it(self, current_s: float, proposed_s: float) -> bool:
        """Hysteresis: the predicted step time must drop by at least `min_gain`."""
        return proposed_s <= current_s * (1.0 - self.min_gain)


def batch_bounds(view: JobView) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per-rank (lower, upper) batch bounds from the job spec and the memory caps."""
    spec = view.spec
    upper = upper_bounds(spec.world_size, spec.global_batch, spec.max_local_batch, view.memory_caps)
    return (spec.min_local_batch,) * spec.world_size, upper


def within_bounds(local_batch: Sequence[int], lower: Sequence[int], upper: Sequence[int]) -> bool:
    if not len(local_batch) == len(lower) == len(upper):
        raise ValueError("a plan and its bounds must name the same ranks")
    if not local_batch:
        return True
    if one_value(lower) and one_value(upper):
        if one_value(local_batch):  # equal shares
            return lower[0] <= local_batch[0] <= upper[0]
        return lower[0] <= min(local_batch) and max(local_batch) <= upper[0]  # one bound each
    return all(map(le, lower, local_batch)) and all(map(le, local_batch, upper))
