"""ANTDT_ACTIONS as the executor writes and reads it: one ActionRecord per outcome."""

from __future__ import annotations

import asyncio

import structlog

from antdt.runtime.bus import Bus, BusError, StreamMissing
from antdt.runtime.coordination.ownership import Ownership
from antdt.schemas import ACTION_STREAM, ActionRecord, ActionResult, Subjects
from antdt.services.controller.counts import JobCounts

log = structlog.get_logger("antdt.controller.actions")
#: Records read back per job at a takeover, at most.
READ_LIMIT = 100_000


class ActionLog:
    def __init__(self, bus: Bus, subjects: Subjects, ownership: Ownership) -> None:
        self.bus = bus
        self.subjects = subjects
        self.ownership = ownership
        self.counts = JobCounts()  # (job, result): records made

    async def record(self, record: ActionRecord) -> ActionRecord:
        """Publish `record`, de-duplicated by action id. A failure or refusal for a job
        owned elsewhere now is not published: its new owner answers for the job."""
        self.counts.add(record.job, record.result.value)
        lost = not self.ownership.owns(record.job)
        if lost and record.result in (ActionResult.FAILED, ActionResult.REFUSED):
            log.info(
                "action not recorded: job not owned",
                action=record.action_id,
                result=record.result.value,
                error=record.error,
            )
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

    async def recorded_ids(self, job: str) -> set[str]:
        """Action ids already on ANTDT_ACTIONS for the job (empty when unreadable)."""
        try:
            replay = await self.bus.jetstream.read(
                ACTION_STREAM, self.subjects.action(job), ActionRecord, limit=READ_LIMIT
            )
        except (StreamMissing, BusError, asyncio.TimeoutError) as exc:
            log.warning("action records unreadable", job=job, error=str(exc))
            return set()
        return {r.action_id for r in replay.items}
