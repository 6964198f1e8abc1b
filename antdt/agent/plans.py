"""Which plan runs at which step, and whether a commanded plan is acceptable. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from antdt.schemas import Plan


def select_plan(plans: Sequence[Plan], step: int) -> Plan:
    """The plan with the highest version whose effective_step <= step.

    Before any plan is effective (a rank that joined with a plan meant for a later step)
    the earliest one is used: a rank must run with some batch size."""
    if not plans:
        raise ValueError("no plan known")
    best: Plan | None = None
    for plan in plans:
        if plan.effective_step <= step and (best is None or plan.version > best.version):
            best = plan
    if best is None:
        best = min(plans, key=lambda p: (p.effective_step, p.version))
    return best


def prune(plans: Sequence[Plan], step: int) -> tuple[Plan, ...]:
    """Drop plans that can no longer be selected at `step` or later (a newer plan is
    already effective), so selection stays a scan over a handful of plans."""
    effective = [p for p in plans if p.effective_step <= step]
    floor = max((p.version for p in effective), default=-1)
    return tuple(sorted((p for p in plans if p.version >= floor), key=lambda p: p.version))


class Verdict(str, Enum):
    ACCEPT = "accept"
    SAME = "same"  # this version again: idempotent
    STALE = "stale"
    BAD = "bad_request"


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str = ""


def _same_plan(a: Plan, b: Plan) -> bool:
    # created_at may differ on a resend of the same decision; everything else must match.
    return a.model_copy(update={"created_at": 0.0}) == b.model_copy(update={"created_at": 0.0})


@dataclass(frozen=True)
class PlanBook:
    """The plans a rank knows, and the step each newer one was acknowledged for."""

    plans: tuple[Plan, ...] = ()
    applied: dict[int, int] = field(default_factory=dict)

    @property
    def newest(self) -> Plan | None:
        return max(self.plans, key=lambda p: p.version, default=None)

    def judge(self, plan: Plan, *, job: str, world_size: int) -> Judgement:
        if plan.job != job:
            return Judgement(Verdict.BAD, f"plan is for job {plan.job!r}, this is {job!r}")
        if plan.world_size != world_size:
            return Judgement(
                Verdict.BAD,
                f"plan has {plan.world_size} local batches for a job of {world_size} ranks",
            )
        newest = self.newest
        if newest is None or plan.version > newest.version:
            return Judgement(Verdict.ACCEPT)
        if plan.version < newest.version:
            return Judgement(
                Verdict.STALE, f"plan version {plan.version} is older than {newest.version}"
            )
        if _same_plan(plan, newest):
            return Judgement(Verdict.SAME)
        return Judgement(Verdict.BAD, f"a different plan with version {plan.version} is known")

    def add(self, plan: Plan, applied_step: int, current_step: int) -> PlanBook:
        plans = prune((*self.plans, plan), current_step)
        keep = {p.version for p in plans}
        applied = {v: s for v, s in self.applied.items() if v in keep}
        applied[plan.version] = applied_step
        return PlanBook(plans=plans, applied=applied)

    def applied_step(self, plan: Plan) -> int:
        return self.applied.get(plan.version, plan.effective_step)


def applied_step(plan: Plan, next_step: int) -> int:
    """The step at which a newly accepted plan takes effect on this rank."""
    return max(plan.effective_step, next_step)
