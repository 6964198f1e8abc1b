"""The one executor: the only place where a decision turns into side effects.

`apply` carries out an action of any kind (one handler per kind). Every etcd write is
fenced by the job's ownership, every plan comes from `plans.next_plan`, every command's
acks go through one `AckTally`, and every outcome is an ActionRecord on ANTDT_ACTIONS."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import assert_never

import structlog

from antdt.runtime.bus import Bus
from antdt.runtime.coordination.ownership import Ownership
from antdt.runtime.store import Put, Store
from antdt.schemas import (
    ActionRecord,
    ActionResult,
    AdjustBatch,
    JobHealth,
    Keys,
    PendingRestart,
    RestartLedger,
    Subjects,
)
from antdt.services.controller import records, restarts
from antdt.services.controller.actionlog import ActionLog
from antdt.services.controller.actions import (
    Action,
    AdjustBatchAction,
    KillRestartAction,
    RestartDeclined,
    plan_version_action_id,
    unsent_action_id,
)
from antdt.services.controller.guardrails import Guardrails
from antdt.services.controller.plans import estimate_current_step, next_plan, plan_violations
from antdt.services.controller.sender import CommandSender
from antdt.services.controller.state import JobState
from antdt.services.controller.view import JobView

log = structlog.get_logger("antdt.controller.executor")


@dataclass(frozen=True)
class Timing:
    lead_steps: int  # steps between an ADJUST_BS decision and its plan's first step
    restart_lead_steps: int  # steps between a KILL_RESTART decision and its checkpoint
    blocklist_ttl_s: float  # how long a host left by a restart stays blocked (0: for good)
    ack_timeout_s: float
    ack_deadline_s: float
    broadcast_from: int  # ranks from which an AdjustBatch is broadcast first


class Executor:
    def __init__(
        self,
        bus: Bus,
        store: Store,
        ownership: Ownership,
        *,
        subjects: Subjects,
        keys: Keys,
        timing: Timing,
    ) -> None:
        self.bus = bus
        self.store = store
        self.ownership = ownership
        self.subjects = subjects
        self.keys = keys
        self.timing = timing
        self.sender = CommandSender(
            bus,
            subjects,
            ack_timeout_s=timing.ack_timeout_s,
            ack_deadline_s=timing.ack_deadline_s,
            broadcast_from=timing.broadcast_from,
        )
        self.actions = ActionLog(bus, subjects, ownership)

    async def apply(self, state: JobState, action: Action, view: JobView) -> ActionRecord:
        """Carry `action` out for the owned job `state` (decided on `view`)."""
        match action:
            case AdjustBatchAction():
                return await self._adjust_batch(state, action)
            case KillRestartAction():
                return await self._kill_restart(state, action, view)
            case RestartDeclined():  # the policy's reason, recorded; nothing else happens
                return await self._unsent(
                    state, action, time.time(), ActionResult.REFUSED, action.reason
                )
            case _:
                assert_never(action)

    async def refuse(self, state: JobState, action: AdjustBatchAction, error: str) -> ActionRecord:
        """Record that `action` was refused before it was applied, and why."""
        return await self._adjusted(state, action, time.time(), error=error)

    # -- ADJUST_BS ------------------------------------------------------------------------

    async def _adjust_batch(
        self, state: JobState, action: AdjustBatchAction, *, effective_step: int | None = None
    ) -> ActionRecord:
        """Plan CAS (fenced), AdjustBatch to every rank, ActionRecord. The plan starts at
        `effective_step`, by default the estimated current step + lead_steps."""
        decided_at, spec = time.time(), state.spec
        violation = plan_violations(
            spec, state.memory_caps, action.local_batch, action.micro_batch, action.accumulation
        )
        if violation:
            return await self._adjusted(state, action, decided_at, error=violation)
        if effective_step is None:
            effective_step = estimate_current_step(state.health, decided_at)
            effective_step += self.timing.lead_steps
        plan = next_plan(
            state.plan,
            action,
            policy=action.source or spec.policy,
            effective_step=effective_step,
            now=decided_at,
        )
        revision = await self.store.cas(
            self.keys.plan(spec.job),
            plan.model_dump_json().encode(),
            state.plan_revision,
            fences=[self.ownership.fence(spec.job)],
        )
        if revision is None:
            error = "plan changed underneath or job no longer owned"
            return await self._adjusted(state, action, decided_at, ActionResult.FAILED, error=error)
        state.plan, state.plan_revision, state.last_action_at = plan, revision, decided_at
        command = AdjustBatch(
            action_id=action.action_id, job=spec.job, plan=plan, incident_id=action.incident_id
        )
        tally = await self.sender.send(command, spec.world_size)
        return await self.actions.record(
            records.adjust_record(
                spec,
                action,
                tally.result,
                decided_at=decided_at,
                completed_at=time.time(),
                plan=plan,
                acked=tally.acked,
            )
        )

    async def _adjusted(
        self,
        state: JobState,
        action: AdjustBatchAction,
        decided_at: float,
        result: ActionResult = ActionResult.REFUSED,
        *,
        error: str,
    ) -> ActionRecord:
        unsent = replace(action, action_id=unsent_action_id(action.action_id, result, decided_at))
        return await self.actions.record(
            records.adjust_record(
                state.spec,
                unsent,
                result,
                decided_at=decided_at,
                completed_at=time.time(),
                error=error,
            )
        )

    # -- KILL_RESTART ---------------------------------------------------------------------

    async def _kill_restart(
        self, state: JobState, action: KillRestartAction, view: JobView
    ) -> ActionRecord:
        """Guardrails again; ledger and blocklist in one fenced CAS; then `_finish`."""
        decided_at = time.time()
        violation = self._restart_violation(state, action, view)
        if violation:
            # A hold (no free spare) repeats at every health tick: recorded once.
            repeat = state.refused_restart == (action.action_id, violation)
            state.refused_restart = (action.action_id, violation)
            return await self._unsent(
                state, action, decided_at, ActionResult.REFUSED, violation, publish=not repeat
            )
        health = state.health
        step = estimate_current_step(health, decided_at) + self.timing.restart_lead_steps
        ledger = restarts.begin(
            state.restarts,
            action,
            checkpoint_step=step,
            decided_at=decided_at,
            step_s=health.step_s if health else 0.0,
        )
        entry = restarts.blocklist_entry(
            action, state.spec.job, at=decided_at, ttl_s=self.timing.blocklist_ttl_s
        )
        blocked = Put(self.keys.blocklist(action.host), entry.model_dump_json().encode())
        async with state.ledger_lock:
            written = await self._write_ledger(state, ledger, also=[blocked])
        if not written or ledger.pending is None:
            error = "job no longer owned, or its restart ledger changed underneath"
            return await self._unsent(state, action, decided_at, ActionResult.FAILED, error)
        state.last_action_at = decided_at
        return await self._finish(state, ledger.pending, view.blocklist)

    def _restart_violation(self, state: JobState, action: KillRestartAction, view: JobView) -> str:
        try:
            rails = Guardrails.from_params(state.spec.policy_params)
        except ValueError as exc:
            return str(exc)
        after = action.local_batch_after
        return (
            restarts.restart_violation(view, action, rails)
            or (plan_violations(state.spec, state.memory_caps, after) if after else "")
            or ("" if self.ownership.owns(state.spec.job) else "job not owned by this replica")
        )

    async def _unsent(
        self,
        state: JobState,
        action: KillRestartAction | RestartDeclined,
        decided_at: float,
        result: ActionResult,
        error: str,
        *,
        publish: bool = True,
    ) -> ActionRecord:
        action_id = action.action_id
        if isinstance(action, KillRestartAction):  # a decline's id is its incident's state
            action_id = unsent_action_id(action_id, result, decided_at)
        record = records.restart_record(
            state.spec,
            action_id,
            action.reason,
            result,
            rank=action.rank,
            host=action.host,
            incident_id=action.incident_id,
            decided_at=decided_at,
            completed_at=time.time(),
            error=error,
        )
        return await self.actions.record(record) if publish else record

    async def _finish(
        self, state: JobState, pending: PendingRestart, blocklist: Collection[str]
    ) -> ActionRecord:
        """Broadcast the restart in flight, write the plan for after it, record it. The
        same restart may be finished again (a takeover): its command is the same."""
        job = state.spec.job
        command = restarts.kill_command(pending, job, frozenset(blocklist))
        tally = await self.sender.send(command, state.spec.world_size)
        if not tally.ok:
            async with state.ledger_lock:
                if state.restarts.pending == pending:
                    await self._write_ledger(state, restarts.abandon(state.restarts))
        elif pending.local_batch_after and state.plan.effective_step <= pending.checkpoint_step:
            after = AdjustBatchAction(
                action_id=plan_version_action_id(job, state.plan.version + 1),
                local_batch=pending.local_batch_after,
                reason=f"plan after {pending.action_id}: rank {pending.rank} on a healthy host",
                incident_id=pending.incident_id,
            )
            await self._adjust_batch(state, after, effective_step=pending.checkpoint_step + 1)
        return await self.actions.record(
            self._restart_record(
                state, pending, tally.result, acked=tally.acked, error=tally.error()
            )
        )

    def _restart_record(
        self,
        state: JobState,
        pending: PendingRestart,
        result: ActionResult,
        *,
        acked: Sequence[int] = (),
        error: str | None = None,
    ) -> ActionRecord:
        return records.restart_record(
            state.spec,
            pending.action_id,
            pending.reason,
            result,
            rank=pending.rank,
            host=pending.host,
            incident_id=pending.incident_id,
            decided_at=pending.decided_at,
            completed_at=time.time(),
            step=pending.checkpoint_step,
            acked=acked,
            error=error,
        )

    async def _write_ledger(
        self, state: JobState, ledger: RestartLedger, also: list[Put] | None = None
    ) -> bool:
        """CAS the ledger (and `also`) fenced by ownership; state follows on success."""
        job = state.spec.job
        revision = await self.store.cas(
            self.keys.restarts(job),
            ledger.model_dump_json().encode(),
            state.restarts_revision,
            fences=[self.ownership.fence(job)],
            also=also or [],
        )
        if revision is None:
            log.warning("restart ledger not written (fenced or changed)", job=job)
            return False
        state.restarts, state.restarts_revision = ledger, revision
        return True

    # -- measurement and takeover ---------------------------------------------------------

    async def observe(self, state: JobState, health: JobHealth) -> float | None:
        """Fold health into the restart in flight; returns the cost once measured."""
        pending = state.restarts.pending
        if pending is None:
            return None
        restarted = any(at > pending.decided_at for at in state.started.values())
        async with state.ledger_lock:
            ledger, state.progress, cost = restarts.observe(
                state.restarts, state.progress, health, restarted
            )
            if ledger == state.restarts or not await self._write_ledger(state, ledger):
                return None
        if cost is not None:
            log.info(
                "restart cost measured",
                job=state.spec.job,
                cost_s=round(cost, 3),
                mean_s=ledger.measured_cost_s,
            )
        return cost

    async def resume(self, state: JobState, blocklist: Collection[str]) -> None:
        """After a takeover: send the current plan again (recorded if no record carries
        its version: a proposal's or a restart's record has another id than the plan's);
        a restart in flight without a record is finished while its checkpoint step is
        ahead, else recorded as the dead owner left it."""
        spec, plan = state.spec, state.plan
        records_ = await self.actions.recorded(spec.job)
        recorded = {r.action_id for r in records_}
        if plan.version > 0:
            action_id = plan_version_action_id(spec.job, plan.version)
            command = AdjustBatch(action_id=action_id, job=spec.job, plan=plan)
            tally = await self.sender.send(command, spec.world_size)
            if all(r.plan_version != plan.version for r in records_):
                await self.actions.record(
                    records.resent_plan_record(
                        spec, plan, action_id, tally.result, tally.acked, completed_at=time.time()
                    )
                )
        pending = state.restarts.pending
        if pending is None or pending.action_id in recorded:
            return
        if state.health is not None and state.health.step < pending.checkpoint_step:
            await self._finish(state, pending, blocklist)
            return
        error = "owner lost while collecting acks; the job had reached the checkpoint step"
        await self.actions.record(
            self._restart_record(state, pending, ActionResult.PARTIAL, error=error)
        )
