"""Reads any controller replica answers (queue group), for agents and policies alike: the
job's plan (`plan.get`) and its spec with every bound a proposal is held to (`spec.get`).
The owner answers from the job's state, any other replica from etcd."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from antdt.runtime.bus import Delivery, Rejected
from antdt.runtime.store import Store
from antdt.schemas import (
    ErrorCode,
    GuardrailSettings,
    JobSpec,
    Keys,
    Plan,
    PlanRequest,
    SpecReply,
    SpecRequest,
    Subjects,
)
from antdt.services.controller.guardrails import Guardrails
from antdt.services.controller.hellos import RankHellos
from antdt.services.controller.jobs import OwnedJobs
from antdt.services.controller.plans import upper_bounds
from antdt.services.controller.proposals import change_limits, rails_in_force
from antdt.services.controller.state import JobState


def spec_reply(
    spec: JobSpec,
    plan: Plan,
    memory_caps: Mapping[int, int],
    rails: Guardrails,
    rails_error: str | None = None,
) -> SpecReply:
    """What `spec.get` answers for a job in this state. Pure."""
    n = spec.world_size
    upper = upper_bounds(n, spec.global_batch, spec.max_local_batch, memory_caps)
    return SpecReply(
        spec=spec,
        plan_version=plan.version,
        guardrails=GuardrailSettings(**dataclasses.asdict(rails)),
        guardrails_error=rails_error[:512] if rails_error else None,
        min_local_batch=(spec.min_local_batch,) * n,
        max_local_batch=upper,
        memory_caps=tuple(memory_caps.get(rank) for rank in range(n)),
        max_move=change_limits(plan.local_batch, rails.max_change),
    )


class Reads:
    """The handlers of `{p}.*.plan.get` and `{p}.*.spec.get`."""

    def __init__(
        self, store: Store, keys: Keys, subjects: Subjects, owned: OwnedJobs, hellos: RankHellos
    ) -> None:
        self.store = store
        self.keys = keys
        self.subjects = subjects
        self.owned = owned
        self.hellos = hellos

    def _check_subject(self, job: str, delivery: Delivery) -> None:
        if self.subjects.job_of(delivery.subject) != job:
            raise Rejected(ErrorCode.BAD_REQUEST, "job does not match the subject")

    async def on_plan_get(self, req: PlanRequest, delivery: Delivery) -> Plan:
        self._check_subject(req.job, delivery)
        plan = await self._plan(req.job)
        if req.rank is not None and req.rank >= plan.world_size:
            raise Rejected(
                ErrorCode.UNKNOWN_RANK,
                f"rank {req.rank}: job {req.job} has ranks 0..{plan.world_size - 1}",
            )
        return plan

    async def on_spec_get(self, req: SpecRequest, delivery: Delivery) -> SpecReply:
        self._check_subject(req.job, delivery)
        state = await self.owned.get(req.job)
        if state is None:
            state = await self._read_state(req.job)
        return spec_reply(state.spec, state.plan, state.memory_caps, *rails_in_force(state.spec))

    async def _plan(self, job: str) -> Plan:
        stored = await self.store.get_model(self.keys.plan(job), Plan)
        if stored is None:
            raise Rejected(ErrorCode.UNKNOWN_JOB, f"job {job!r} is not registered")
        return stored[0]

    async def _read_state(self, job: str) -> JobState:
        """The job as etcd holds it (this replica does not own it)."""
        spec = await self.store.get_model(self.keys.spec(job), JobSpec)
        if spec is None:
            raise Rejected(ErrorCode.UNKNOWN_JOB, f"job {job!r} is not registered")
        state = JobState(spec=spec[0], plan=await self._plan(job), plan_revision=0)
        for hello in await self.hellos.latest(job):
            state.learn_hello(hello)  # memory caps, as the owner learns them
        return state
