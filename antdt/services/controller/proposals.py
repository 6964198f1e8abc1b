"""Custom policies' ActionProposals, held to every policy's guardrails. The job's owner
answers with the ActionRecord, or refuses with an ErrorReply (also recorded); a job with
no owner is claimed by the replica that hears it, an unknown or ended one refused by any.
The pure check (`check_proposal`) is, in order: unknown_rank, bad_request, stale,
guardrail, no_change, hold."""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from antdt.runtime.bus import Delivery, Rejected
from antdt.schemas import (
    ActionProposal,
    ActionRecord,
    ActionResult,
    ErrorCode,
    JobSpec,
    Subjects,
)
from antdt.services.controller.actions import AdjustBatchAction
from antdt.services.controller.executor import Executor
from antdt.services.controller.guardrails import Guardrails
from antdt.services.controller.plans import plan_violations
from antdt.services.controller.state import JobState
from antdt.services.controller.view import JobView


@dataclass(frozen=True)
class Refusal:
    code: ErrorCode
    reason: str


def check_proposal(view: JobView, proposal: ActionProposal, rails: Guardrails) -> Refusal | None:
    """Why the owner must refuse `proposal` in this view (None: execute it). Pure."""
    spec, plan = view.spec, view.plan
    n = len(proposal.local_batch)
    if n > spec.world_size:
        return Refusal(
            ErrorCode.UNKNOWN_RANK,
            f"batches for ranks {spec.world_size}..{n - 1}: job {spec.job} has ranks "
            f"0..{spec.world_size - 1}",
        )
    if n < spec.world_size:
        return Refusal(
            ErrorCode.BAD_REQUEST, f"{n} batches for the {spec.world_size} ranks of the job"
        )
    if proposal.plan_version is not None and proposal.plan_version != plan.version:
        return Refusal(
            ErrorCode.STALE,
            f"computed from plan version {proposal.plan_version}; the job's plan is "
            f"version {plan.version}",
        )
    violation = plan_violations(
        spec, view.memory_caps, proposal.local_batch, proposal.micro_batch, proposal.accumulation
    )
    if violation:
        return Refusal(ErrorCode.GUARDRAIL, violation)
    too_far = change_violation(plan.local_batch, proposal.local_batch, rails.max_change)
    if too_far:
        return Refusal(ErrorCode.GUARDRAIL, too_far)
    if _running(proposal.local_batch, proposal.micro_batch, proposal.accumulation) == _running(
        plan.local_batch, plan.micro_batch, plan.accumulation
    ):
        return Refusal(
            ErrorCode.NO_CHANGE, f"the proposal is plan version {plan.version}, running now"
        )
    hold = hold_reason(view, rails)
    if hold:
        return Refusal(ErrorCode.HOLD, hold)
    return None


def change_limits(old: Sequence[int], max_change: float) -> tuple[int, ...]:
    """Per rank, how far its batch may move from `old` in one change, as
    `plans.bounded_change` lets it: max(1, floor(max_change x max(old batch, mean batch)));
    the global batch when unbounded (max_change inf)."""
    if math.isinf(max_change):
        return (sum(old),) * len(old)
    mean = sum(old) / len(old)
    return tuple(max(1, math.floor(max_change * max(a, mean))) for a in old)


def change_violation(old: Sequence[int], new: Sequence[int], max_change: float) -> str:
    """The first rank moving further than `change_limits` lets it ('' if none)."""
    if math.isinf(max_change):
        return ""
    limits = change_limits(old, max_change)
    for rank, (a, b, limit) in enumerate(zip(old, new, limits, strict=True)):
        if abs(b - a) > limit:
            return (
                f"rank {rank}: batch {a} -> {b} moves by {abs(b - a)}, more than "
                f"max_change {max_change:g} allows ({limit})"
            )
    return ""


def hold_reason(view: JobView, rails: Guardrails) -> str | None:
    """The timing guardrails: cooldown and no restart in flight always; measured and
    settled plan (and restart) when health is known (a proposal brings its own figures,
    so no health is no reason to wait)."""
    if view.last_action_at is not None and view.now - view.last_action_at < rails.cooldown_s:
        ago = view.now - view.last_action_at
        return f"cooling down: last action {ago:.1f}s ago, cooldown_s is {rails.cooldown_s:g}"
    pending = view.restarts.pending
    if pending is not None and rails.restart_in_flight(view):
        return f"a restart is in flight ({pending.action_id}, step {pending.checkpoint_step})"
    health, plan = view.health, view.plan
    if health is None:
        return None
    resumed = view.restarts.last_checkpoint_step
    if resumed is not None and health.step < resumed + 1 + rails.settle_steps:
        return f"settling after the restart from step {resumed}"
    if health.plan_version < plan.version:
        return f"plan version {plan.version} not measured yet"
    if health.step < plan.effective_step + rails.settle_steps:
        return (
            f"settling after the plan switch: step {health.step} < "
            f"{plan.effective_step} + settle_steps {rails.settle_steps}"
        )
    return None


def rails_for(spec: JobSpec) -> Guardrails:
    """The job's guardrail parameters; the common defaults when they do not parse."""
    return rails_in_force(spec)[0]


def rails_in_force(spec: JobSpec) -> tuple[Guardrails, str | None]:
    """The job's guardrails, and why its parameters did not parse (None: they did; the
    common defaults are in force otherwise)."""
    try:
        return Guardrails.from_params(spec.policy_params), None
    except ValueError as exc:
        return Guardrails(), str(exc)


def proposal_action_id(job: str, proposal_id: str) -> str:
    """The action id of an executed proposal: unique per job in ANTDT_ACTIONS (which
    de-duplicates by it), at most 128 characters."""
    action_id = f"{job}-proposal-{proposal_id}"
    if len(action_id) <= 128:
        return action_id
    digest = hashlib.sha256(action_id.encode()).hexdigest()[:24]
    return f"{job[:80]}-proposal-{digest}"


def _running(
    local: Sequence[int], micro: Sequence[int] | None, accumulation: Sequence[int] | None
) -> tuple[tuple[int, ...], ...]:
    return (
        tuple(local),
        tuple(micro or local),
        tuple(accumulation or (1,) * len(local)),
    )


#: The state of the job to answer for: ours (claimed if nobody owned it), None when another
#: replica owns it; raises Rejected for a job that is unknown or has ended.
StateOf = Callable[[str], Awaitable[JobState | None]]


class ProposalDesk:
    """The I/O shell: one handler for `{p}.*.proposal`, executing through the executor."""

    def __init__(
        self, executor: Executor, subjects: Subjects, state_of: StateOf, *, remember: int = 1024
    ) -> None:
        self.executor = executor
        self.subjects = subjects
        self.state_of = state_of
        self.remember = remember
        self.executed: OrderedDict[tuple[str, str], ActionRecord] = OrderedDict()

    async def handle(self, proposal: ActionProposal, delivery: Delivery) -> ActionRecord | None:
        job = self.subjects.job_of(delivery.subject)
        if proposal.job != job:
            raise Rejected(
                ErrorCode.BAD_REQUEST, f"proposal for job {proposal.job!r} sent on {job!r}"
            )
        state = await self.state_of(job)  # unknown_job, job_ended: refused by any replica
        if state is None:
            return None  # another replica owns the job and answers
        async with state.busy:  # one decision at a time per job, policies included
            outcome = await self._decide(state, proposal)
        if isinstance(outcome, Refusal):
            raise Rejected(outcome.code, outcome.reason)
        return outcome

    async def _decide(self, state: JobState, proposal: ActionProposal) -> ActionRecord | Refusal:
        key = (proposal.job, proposal.proposal_id)
        if key in self.executed:
            return self.executed[key]
        action = AdjustBatchAction(
            action_id=proposal_action_id(proposal.job, proposal.proposal_id),
            local_batch=proposal.local_batch,
            micro_batch=proposal.micro_batch,
            accumulation=proposal.accumulation,
            reason=proposal.reason or f"proposed by {proposal.source}",
            incident_id=proposal.incident_id,
            source=f"proposal:{proposal.source}"[:64],
        )
        now = time.time()
        view = state.view(now)
        refusal = check_proposal(view, proposal, rails_for(state.spec))
        if refusal is not None:
            # (recorded under a distinct id: a retry of it may yet be executed)
            await self.executor.refuse(state, action, f"{refusal.code}: {refusal.reason}")
            return refusal
        record = await self.executor.apply(state, action, view)
        if record.result == ActionResult.REFUSED:  # the executor's own last check
            return Refusal(ErrorCode.GUARDRAIL, record.error or "refused by the executor")
        self.executed[key] = record
        while len(self.executed) > self.remember:
            self.executed.popitem(last=False)
        return record
