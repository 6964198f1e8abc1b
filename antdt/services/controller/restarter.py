"""KILL_RESTART side effects (the executor's second half; decisions are in `restarts.py`).

1. Check the guardrails again (rank, budget, one in flight, cooldown, the plan after the
   restart within bounds) and that this replica owns the job.
2. One etcd transaction, fenced by ownership and compare-and-swap on the ledger's
   revision: `jobs/{job}/restarts` (budget used, the restart in flight with its
   checkpoint step = estimated current step + `restart_lead_steps`) and
   `blocklist/{host}`.
3. Broadcast `KillRestart` on `{p}.{job}.cmd`; collect acks from every rank (retries until
   the ack deadline). If no rank accepted, nothing is in flight any more (budget stays).
4. If ranks accepted and the policy gave a plan for after the restart, write it as the
   next plan version, effective at checkpoint_step + 1 (the restarted ranks get it when
   they register again; the live ones by AdjustBatch, recorded as its own action).
5. Record the KILL_RESTART on ANTDT_ACTIONS (action id `{job}-restart-{n}`).

The restart cost is measured from JobHealth (`observe`) and kept in the ledger. After a
takeover, `resume` finishes an action the dead owner left in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection

import structlog

from antdt.runtime.bus import BusError, StreamMissing
from antdt.runtime.store import Put
from antdt.schemas import (
    ACTION_STREAM,
    Ack,
    ActionRecord,
    ActionResult,
    AdjustBatch,
    BlocklistEntry,
    ErrorReply,
    JobHealth,
    KillRestart,
    PendingRestart,
    RestartLedger,
)
from antdt.services.controller.actions import AdjustBatchAction, KillRestartAction
from antdt.services.controller.executor import (
    Executor,
    JobState,
    ack_result,
    estimate_current_step,
    plan_violations,
)
from antdt.services.controller.guardrails import Guardrails
from antdt.services.controller.restarts import (
    AckTally,
    abandon,
    begin,
    kill_command,
    observe,
    restart_violation,
)
from antdt.services.controller.view import JobView

log = structlog.get_logger("antdt.controller.restarter")


class Restarter:
    def __init__(
        self, executor: Executor, *, restart_lead_steps: int, blocklist_ttl_s: float = 0.0
    ) -> None:
        self.x = executor
        self.restart_lead_steps = restart_lead_steps
        self.blocklist_ttl_s = blocklist_ttl_s  # 0: until deleted

    async def kill_restart(
        self, state: JobState, action: KillRestartAction, view: JobView
    ) -> ActionRecord:
        decided_at = time.time()
        violation = self._violation(state, action, view)
        if violation:
            record = restart_record(state, action.action_id, action.reason, decided_at,
                                    ActionResult.REFUSED, rank=action.rank, host=action.host,
                                    incident_id=action.incident_id, error=violation)  # fmt: skip
            return await self.x.record(record)
        health = state.health
        step = estimate_current_step(health, decided_at) + self.restart_lead_steps
        ledger = begin(state.restarts, action, checkpoint_step=step, decided_at=decided_at,
                       step_s=health.step_s if health else 0.0)  # fmt: skip
        until = decided_at + self.blocklist_ttl_s if self.blocklist_ttl_s else None
        entry = BlocklistEntry(host=action.host, job=state.spec.job, rank=action.rank,
                               action_id=action.action_id, reason=action.reason[:512],
                               at=decided_at, until=until)  # fmt: skip
        blocked = Put(self.x.keys.blocklist(action.host), entry.model_dump_json().encode())
        async with state.ledger_lock:
            written = await self._write_ledger(state, ledger, also=[blocked])
        if not written or ledger.pending is None:
            error = "job no longer owned, or its restart ledger changed underneath"
            record = restart_record(state, action.action_id, action.reason, decided_at,
                                    ActionResult.FAILED, rank=action.rank, host=action.host,
                                    incident_id=action.incident_id, error=error)  # fmt: skip
            return await self.x.record(record)
        state.last_action_at = decided_at
        return await self.complete(state, ledger.pending, view.blocklist)

    def _violation(self, state: JobState, action: KillRestartAction, view: JobView) -> str:
        try:
            rails = Guardrails.from_params(state.spec.policy_params)
        except ValueError as exc:
            return str(exc)
        after = action.local_batch_after
        return (
            restart_violation(view, action, rails)
            or (plan_violations(state.spec, state.memory_caps, after) if after else "")
            or ("" if self.x.ownership.owns(state.spec.job) else "job not owned by this replica")
        )

    async def complete(
        self, state: JobState, pending: PendingRestart, blocklist: Collection[str]
    ) -> ActionRecord:
        """Broadcast the restart, write the plan for after it, record it (idempotent)."""
        job = state.spec.job
        tally = await self.broadcast(kill_command(pending, job, frozenset(blocklist)), state)
        if not tally.ok:
            async with state.ledger_lock:
                if state.restarts.pending == pending:
                    await self._write_ledger(state, abandon(state.restarts))
        elif pending.local_batch_after and state.plan.effective_step <= pending.checkpoint_step:
            after = AdjustBatchAction(
                action_id=f"{job}-plan-{state.plan.version + 1}",
                local_batch=pending.local_batch_after,
                reason=f"plan after {pending.action_id}: rank {pending.rank} on a healthy host",
                incident_id=pending.incident_id,
            )
            await self.x.adjust_batch(state, after, effective_step=pending.checkpoint_step + 1)
        record = restart_record(
            state, pending.action_id, pending.reason, pending.decided_at,
            ack_result(len(tally.ok), state.spec.world_size), rank=pending.rank,
            host=pending.host, incident_id=pending.incident_id, step=pending.checkpoint_step,
            acked=sorted(tally.ok), error=tally.error(),
        )  # fmt: skip
        return await self.x.record(record)

    async def broadcast(self, command: KillRestart, state: JobState) -> AckTally:
        """Send to every rank at once until each answered or the ack deadline passed."""
        tally = AckTally(command, state.spec.world_size)
        subject = self.x.subjects.command_all(command.job)
        deadline = time.monotonic() + self.x.ack_deadline_s
        while not tally.complete and time.monotonic() < deadline:
            seen = 0

            def done(replies: list[Ack | ErrorReply]) -> bool:
                nonlocal seen
                for reply in replies[seen:]:
                    tally.add(reply)
                seen = len(replies)
                return tally.complete

            timeout = min(self.x.ack_timeout_s, max(0.01, deadline - time.monotonic()))
            try:
                await self.x.bus.gather(subject, command, Ack, timeout=timeout, done=done)
            except BusError as exc:
                log.info("kill_restart broadcast failed", job=command.job, error=str(exc))
            if not tally.complete:
                await asyncio.sleep(0.05)
        for reason in dict.fromkeys(tally.rejected):
            self.x.bus.rejections.record("kill_restart_ack", "bad_ack", reason, subject)
        return tally

    async def _write_ledger(
        self, state: JobState, ledger: RestartLedger, also: list[Put] | None = None
    ) -> bool:
        """CAS the ledger (and `also`) fenced by ownership; state follows on success."""
        job = state.spec.job
        revision = await self.x.store.cas(
            self.x.keys.restarts(job),
            ledger.model_dump_json().encode(),
            state.restarts_revision,
            fences=[self.x.ownership.fence(job)],
            also=also or [],
        )
        if revision is None:
            log.warning("restart ledger not written (fenced or changed)", job=job)
            return False
        state.restarts, state.restarts_revision = ledger, revision
        return True

    # -- measurement and takeover --------------------------------------------------------

    async def observe(self, state: JobState, health: JobHealth) -> float | None:
        """Fold health into the restart in flight; returns the cost once measured."""
        pending = state.restarts.pending
        if pending is None:
            return None
        restarted = any(at > pending.decided_at for at in state.started.values())
        async with state.ledger_lock:
            ledger, state.progress, cost = observe(
                state.restarts, state.progress, health, restarted
            )
            if ledger == state.restarts or not await self._write_ledger(state, ledger):
                return None
        if cost is not None:
            log.info("restart cost measured", job=state.spec.job, cost_s=round(cost, 3),
                     mean_s=ledger.measured_cost_s)  # fmt: skip
        return cost

    async def resume(self, state: JobState, blocklist: Collection[str]) -> None:
        """After a takeover (first health): finish what the dead owner left in flight.
        The current plan is re-sent (agents ack a known version again) and recorded if its
        record is missing; a restart in flight without a record is broadcast again while
        its checkpoint step is ahead, else recorded as the dead owner left it."""
        job = state.spec.job
        recorded = await self.recorded_ids(job)
        plan = state.plan
        if plan.version > 0:
            action_id = f"{job}-plan-{plan.version}"
            command = AdjustBatch(action_id=action_id, job=job, plan=plan)
            acked = await self.x.send_to_all(state.spec.world_size, command)
            if action_id not in recorded:
                result = ack_result(len(acked), state.spec.world_size)
                await self.x.record(resent_plan_record(state, action_id, result, acked))
        pending = state.restarts.pending
        if pending is None or pending.action_id in recorded:
            return
        if state.health is not None and state.health.step < pending.checkpoint_step:
            await self.complete(state, pending, blocklist)
            return
        error = "owner lost while collecting acks; the job had reached the checkpoint step"
        record = restart_record(state, pending.action_id, pending.reason, pending.decided_at,
                                ActionResult.PARTIAL, rank=pending.rank, host=pending.host,
                                incident_id=pending.incident_id, step=pending.checkpoint_step,
                                error=error)  # fmt: skip
        await self.x.record(record)

    async def recorded_ids(self, job: str) -> set[str]:
        """Action ids already on ANTDT_ACTIONS for the job (empty when unreadable)."""
        try:
            replay = await self.x.bus.jetstream.read(
                ACTION_STREAM, self.x.subjects.action(job), ActionRecord, limit=100_000
            )
        except (StreamMissing, BusError, asyncio.TimeoutError) as exc:
            log.warning("action records unreadable", job=job, error=str(exc))
            return set()
        return {r.action_id for r in replay.items}


def resent_plan_record(
    state: JobState, action_id: str, result: ActionResult, acked: list[int]
) -> ActionRecord:
    """The record of a plan the dead owner wrote but never recorded."""
    plan = state.plan
    return ActionRecord(
        action_id=action_id, job=state.spec.job, kind="adjust_batch",
        policy=state.spec.policy, reason=f"{plan.reason} (recorded after a takeover)"[:1024],
        plan_version=plan.version, local_batch=plan.local_batch,
        effective_step=plan.effective_step, decided_at=plan.created_at,
        completed_at=time.time(), result=result, acked_ranks=tuple(acked),
        missing_ranks=tuple(r for r in range(state.spec.world_size) if r not in acked),
    )  # fmt: skip


def restart_record(
    state: JobState,
    action_id: str,
    reason: str,
    decided_at: float,
    result: ActionResult,
    *,
    rank: int,
    host: str,
    incident_id: str | None,
    step: int | None = None,
    acked: list[int] | None = None,
    error: str | None = None,
) -> ActionRecord:
    acked = acked or []
    sent = step is not None
    return ActionRecord(
        action_id=action_id, job=state.spec.job, kind="kill_restart", policy=state.spec.policy,
        reason=reason[:1024], incident_id=incident_id, effective_step=step, rank=rank,
        host=host[:128], decided_at=decided_at, completed_at=time.time(), result=result,
        acked_ranks=tuple(acked),
        missing_ranks=tuple(r for r in range(state.spec.world_size) if r not in acked)
        if sent else (),
        error=error,
    )  # fmt: skip
