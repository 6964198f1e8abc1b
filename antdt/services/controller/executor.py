"""The controller's executor: the only place a decision turns into side effects.

For an AdjustBatch action it (1) writes the next Plan with compare-and-swap on the plan's
revision, fenced by our ownership of the job, (2) sends AdjustBatch to every rank and
collects acks (retries, deadline; an ack from the wrong rank or action is not an ack),
(3) records an ActionRecord on JetStream ANTDT_ACTIONS. It never acts for a job it does
not own: the fence makes a stale owner's write fail. KILL_RESTART: `restarter.py`."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

import structlog

from antdt.runtime.bus import Bus, BusError
from antdt.runtime.coordination.ownership import Ownership
from antdt.runtime.store import Store
from antdt.runtime.telemetry import tracing
from antdt.schemas import (
    Ack,
    ActionRecord,
    ActionResult,
    AdjustBatch,
    Incident,
    JobHealth,
    JobSpec,
    Keys,
    Plan,
    RestartLedger,
    Subjects,
)
from antdt.services.controller.actions import AdjustBatchAction
from antdt.services.controller.plans import plan_violations
from antdt.services.controller.restarts import Progress
from antdt.services.controller.view import JobView, remaining_samples

log = structlog.get_logger("antdt.controller.executor")


@dataclass
class JobState:
    """What the owning replica knows of a job (rebuilt from etcd on takeover)."""

    spec: JobSpec
    plan: Plan
    plan_revision: int
    health: JobHealth | None = None
    incidents: dict[str, Incident] = field(default_factory=dict)
    memory_caps: dict[int, int] = field(default_factory=dict)
    last_action_at: float | None = None
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)
    hosts: dict[int, str] = field(default_factory=dict)  # rank -> host, from RankHello
    restarts: RestartLedger = field(default_factory=RestartLedger)
    restarts_revision: int = 0  # mod revision of jobs/{job}/restarts (0: absent)
    ledger_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # restart ledger writes
    resume_pending: bool = False  # a takeover: re-send and re-record on the first health
    started: dict[int, float] = field(default_factory=dict)  # rank -> its process's start
    progress: Progress | None = None  # where the job stands during a restart in flight

    def view(self, now: float, blocklist: frozenset[str] = frozenset()) -> JobView:
        """The read-only view a policy decides on."""
        hosts = {r.rank: r.host for r in self.health.ranks} if self.health else {}
        hosts.update(self.hosts)  # a RankHello is newer than the health's window
        return JobView(
            spec=self.spec,
            plan=self.plan,
            health=self.health,
            open_incidents=tuple(self.incidents.values()),
            memory_caps=dict(self.memory_caps),
            last_action_at=self.last_action_at,
            now=now,
            hosts=hosts,
            blocklist=blocklist,
            restarts=self.restarts,
            remaining_samples=remaining_samples(self.spec, self.health),
        )


def estimate_current_step(health: JobHealth | None, now: float) -> int:
    """Health is up to a period old: extrapolate the step from the measured step time."""
    if health is None:
        return 0
    if health.step_s <= 0:
        return health.step
    return health.step + math.ceil(max(0.0, now - health.at) / health.step_s)


class Executor:
    def __init__(
        self,
        bus: Bus,
        store: Store,
        ownership: Ownership,
        *,
        subjects: Subjects,
        keys: Keys,
        lead_steps: int,
        ack_timeout_s: float,
        ack_deadline_s: float,
    ) -> None:
        self.bus = bus
        self.store = store
        self.ownership = ownership
        self.subjects = subjects
        self.keys = keys
        self.lead_steps = lead_steps
        self.ack_timeout_s = ack_timeout_s
        self.ack_deadline_s = ack_deadline_s
        self.records: list[ActionRecord] = []

    async def adjust_batch(
        self, state: JobState, action: AdjustBatchAction, *, effective_step: int | None = None
    ) -> ActionRecord:
        """ADJUST_BS: plan CAS (fenced), AdjustBatch to every rank, ActionRecord. The plan
        starts at `effective_step`, by default the estimated current step + lead_steps."""
        decided_at = time.time()
        spec = state.spec
        violation = plan_violations(
            spec, state.memory_caps, action.local_batch, action.micro_batch, action.accumulation
        )
        if violation:
            return await self.record(
                adjust_record(state, action, decided_at, ActionResult.REFUSED, error=violation)
            )
        if effective_step is None:
            effective_step = estimate_current_step(state.health, decided_at) + self.lead_steps
        plan = Plan(
            job=spec.job,
            version=state.plan.version + 1,
            local_batch=action.local_batch,
            micro_batch=action.micro_batch,
            accumulation=action.accumulation,
            effective_step=effective_step,
            reason=action.reason[:512],
            policy=action.source or spec.policy,
            created_at=decided_at,
        )
        revision = await self.store.cas(
            self.keys.plan(spec.job),
            plan.model_dump_json().encode(),
            state.plan_revision,
            fences=[self.ownership.fence(spec.job)],
        )
        if revision is None:
            error = "plan changed underneath or job no longer owned"
            return await self.record(
                adjust_record(state, action, decided_at, ActionResult.FAILED, error=error)
            )
        state.plan, state.plan_revision, state.last_action_at = plan, revision, decided_at
        command = AdjustBatch(
            action_id=action.action_id, job=spec.job, plan=plan, incident_id=action.incident_id
        )
        acked = await self.send_to_all(spec.world_size, command)
        result = ack_result(len(acked), spec.world_size)
        return await self.record(
            adjust_record(state, action, decided_at, result, plan=plan, acked=acked)
        )

    async def refuse(self, state: JobState, action: AdjustBatchAction, error: str) -> ActionRecord:
        """Record that `action` was refused (a guardrail, a stale plan version), with why."""
        record = adjust_record(state, action, time.time(), ActionResult.REFUSED, error=error)
        return await self.record(record)

    async def send_to_all(self, world_size: int, command: AdjustBatch) -> list[int]:
        """Send to every rank until each acks or the deadline passes; returns acked ranks."""
        deadline = time.monotonic() + self.ack_deadline_s
        pending = set(range(world_size))
        acked: set[int] = set()
        while pending and time.monotonic() < deadline:
            results = await asyncio.gather(*(self._send_one(r, command) for r in sorted(pending)))
            for rank, ok in zip(sorted(pending), results, strict=True):
                if ok:
                    acked.add(rank)
            pending -= acked
            if pending:
                await asyncio.sleep(0.05)
        return sorted(acked)

    async def _send_one(self, rank: int, command: AdjustBatch) -> bool:
        subject = self.subjects.command(command.job, rank)
        with tracing.send(subject, command, rank) as sent:  # a span per attempt, a child per ack
            try:
                ack = await self.bus.request(subject, command, Ack, timeout=self.ack_timeout_s)
            except BusError as exc:
                log.info("no ack", job=command.job, rank=rank, error=str(exc))
                return False
            sent(ack)
        reason = adjust_ack_problem(ack, rank, command)
        if reason:
            self.bus.rejections.record("adjust_ack", "bad_ack", reason, subject)
            return False
        return ack.ok

    async def record(self, record: ActionRecord) -> ActionRecord:
        """Keep the record and publish it on ANTDT_ACTIONS, de-duplicated by action id.
        A failure because another replica owns the job now is not published: that replica
        answers for the job (and may publish this very action id with its real result)."""
        self.records.append(record)
        lost = not self.ownership.owns(record.job)
        if lost and record.result in (ActionResult.FAILED, ActionResult.REFUSED):
            log.info("action not recorded: job not owned", action=record.action_id,
                     result=record.result.value, error=record.error)  # fmt: skip
            return record
        try:
            subject = self.subjects.action(record.job)
            await self.bus.jetstream.publish(subject, record, msg_id=record.action_id)
        except Exception as exc:
            log.warning("action record not persisted", action=record.action_id, error=str(exc))
        log.info(
            "action",
            job=record.job,
            action=record.action_id,
            kind=record.kind,
            result=record.result.value,
            local_batch=record.local_batch,
            effective_step=record.effective_step,
            reason=record.reason,
            error=record.error,
        )
        return record


def adjust_ack_problem(ack: Ack, rank: int, command: AdjustBatch) -> str:
    """Why a reply to an AdjustBatch sent to `rank` is not its ack ('' when it is)."""
    if ack.job != command.job or ack.action_id != command.action_id:
        return f"ack for {ack.job}/{ack.action_id}, expected {command.job}/{command.action_id}"
    if ack.rank != rank:
        return f"ack from rank {ack.rank} to a command for rank {rank}"
    if ack.ok and ack.plan_version not in (None, command.plan.version):
        return f"rank {rank} acked plan version {ack.plan_version}, not {command.plan.version}"
    return ""


def ack_result(acked: int, world_size: int) -> ActionResult:
    if acked == world_size:
        return ActionResult.APPLIED
    return ActionResult.PARTIAL if acked else ActionResult.FAILED


def adjust_record(
    state: JobState,
    action: AdjustBatchAction,
    decided_at: float,
    result: ActionResult,
    *,
    plan: Plan | None = None,
    acked: list[int] | None = None,
    error: str | None = None,
) -> ActionRecord:
    acked = acked or []
    return ActionRecord(
        action_id=action.action_id,
        job=state.spec.job,
        kind="adjust_batch",
        policy=(action.source or state.spec.policy)[:64],
        reason=action.reason[:1024],
        incident_id=action.incident_id,
        plan_version=plan.version if plan else None,
        local_batch=plan.local_batch if plan else action.local_batch,
        micro_batch=action.micro_batch,
        accumulation=action.accumulation,
        effective_step=plan.effective_step if plan else None,
        decided_at=decided_at,
        completed_at=time.time(),
        result=result,
        acked_ranks=tuple(acked),
        missing_ranks=tuple(r for r in range(state.spec.world_size) if r not in acked)
        if plan
        else (),
        error=error,
    )
