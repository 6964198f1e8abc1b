"""Which plan runs at which step, and whether a commanded plan is acceptable. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from antdt.schemas import Plan


def select_plan(plans: Sequence[Plan], step: int, starts: Mapping[int, int] | None = None) -> Plan:
    """The plan with the highest version whose first step (its `starts` entry by version,
    else its effective_step) <= step.

    Before any plan is effective (a rank that joined with a plan meant for a later step)
    the earliest one is used: a rank must run with some batch size."""
    if not plans:
        raise ValueError("no plan known")
    first = _first_steps(plans, starts)
    best: Plan | None = None
    for plan in plans:
        if first[plan.version] <= step and (best is None or plan.version > best.version):
            best = plan
    if best is None:
        best = min(plans, key=lambda p: (first[p.version], p.version))
    return best


def _first_steps(plans: Sequence[Plan], starts: Mapping[int, int] | None) -> dict[int, int]:
    """Each plan's first step, by version: its `starts` entry, else its effective step."""
    return {p.version: p.effective_step for p in plans} | dict(starts or {})


def prune(
    plans: Sequence[Plan],
    step: int,
    starts: Mapping[int, int] | None = None,
    agreed: int | None = None,
) -> tuple[Plan, ...]:
    """Drop plans that can no longer be selected at `step` or later (a newer plan of
    those up to version `agreed`, all by default, is already effective), so selection
    stays a scan over a handful of plans."""
    first = _first_steps(plans, starts)
    usable = [p for p in plans if agreed is None or p.version <= agreed]
    effective = [p for p in usable if first[p.version] <= step]
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
    """The plans a rank knows; the step each starts at on this rank (for one not agreed
    yet, the earliest it can: what its ack said); and the newest version every rank
    holds (`agreed`: the registration's, or agreed through a step's count), above which
    a plan waits, so that every rank switches to it at the same step."""

    plans: tuple[Plan, ...] = ()
    applied: dict[int, int] = field(default_factory=dict)
    agreed: int = -1

    @property
    def newest(self) -> Plan | None:
        return max(self.plans, key=lambda p: p.version, default=None)

    def select(self, step: int) -> Plan:
        """The plan step `step` runs under: of those every rank holds."""
        usable = [p for p in self.plans if p.version <= self.agreed]
        return select_plan(usable, step, self.applied)

    def agree(self, version: int, first_open: int) -> PlanBook:
        """Every rank holds `version` as its newest (a step's count said so) while the
        step before `first_open` is fixed everywhere: it starts at its effective step, or
        at `first_open` if that has passed."""
        plan = next((p for p in self.plans if p.version == version), None)
        if plan is None or version <= self.agreed:
            return self
        applied = {**self.applied, version: max(plan.effective_step, first_open)}
        return replace(self, applied=applied, agreed=version)

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

    def add(
        self, plan: Plan, applied_step: int, current_step: int, *, agreed: bool = False
    ) -> PlanBook:
        """`plan` known from now on, starting at `applied_step` (if `agreed`: held by every
        rank, the registration's; else once a step's count agrees on it)."""
        applied = {**self.applied, plan.version: applied_step}
        version = max(self.agreed, plan.version) if agreed else self.agreed
        others = (p for p in self.plans if p.version != plan.version)  # (registered again)
        plans = prune((*others, plan), current_step, applied, version)
        keep = {p.version for p in plans}
        applied = {v: s for v, s in applied.items() if v in keep}
        return PlanBook(plans=plans, applied=applied, agreed=version)

    def applied_step(self, plan: Plan) -> int:
        return self.applied.get(plan.version, plan.effective_step)


def applied_step(plan: Plan, next_step: int) -> int:
    """The step at which a newly accepted plan takes effect on this rank."""
    return max(plan.effective_step, next_step)
