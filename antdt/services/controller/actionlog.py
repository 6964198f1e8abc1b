"""ANTDT_ACTIONS as the executor writes and reads it: one ActionRecord per outcome."""

from __future__ import annotations

import asyncio
import time

import structlog

from antdt.runtime.bus import Bus, BusError, StreamMissing, StreamUnanswered
from antdt.runtime.coordination.ownership import Ownership
from antdt.runtime.telemetry.brief import brief_batches
from antdt.schemas import ACTION_STREAM, ActionRecord, ActionResult, Subjects
from antdt.services.controller.counts import JobCounts

log = structlog.get_logger("antdt.controller.actions")
#: Records read back per job at a takeover, at most.
READ_LIMIT = 100_000
#: Seconds a record's publish is tried again while its ack does not come (a replicated
#: stream electing a leader after a node died takes a few): the same Nats-Msg-Id each
#: time, so a try whose ack only was lost is not stored twice.
PERSIST_FOR_S = 15.0
#: Seconds between two tries, at first; doubled after each, up to RETRY_PAUSE_MAX_S.
RETRY_PAUSE_S = 0.25
RETRY_PAUSE_MAX_S = 2.0


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
        await self._persist(record)
        log.info(
            "action",
            job=record.job,
            action=record.action_id,
            kind=record.kind,
            result=record.result.value,
            local_batch=brief_batches(record.local_batch),
            effective_step=record.effective_step,
            reason=record.reason,
            error=record.error,
        )
        return record

    async def _persist(self, record: ActionRecord) -> None:
        """Publish `record` to ANTDT_ACTIONS until it is acked or PERSIST_FOR_S ran out.
        The executor waits: the records of a job stay in the order it made them."""
        subject = self.subjects.action(record.job)
        deadline = time.monotonic() + PERSIST_FOR_S
        pause, tries = RETRY_PAUSE_S, 0
        while True:
            tries += 1
            try:
                await self.bus.jetstream.publish(subject, record, msg_id=record.action_id)
                return
            except (TimeoutError, StreamUnanswered) as exc:  # its stream electing a leader
                if time.monotonic() + pause > deadline:
                    return _not_persisted(record, tries, exc)
            except Exception as exc:  # the stream missing, refused: trying again won't help
                return _not_persisted(record, tries, exc)
            log.info("action record publish tried again", action=record.action_id)
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_PAUSE_MAX_S)

    async def recorded(self, job: str) -> list[ActionRecord]:
        """The job's records on ANTDT_ACTIONS, oldest first (empty when unreadable)."""
        try:
            replay = await self.bus.jetstream.read(
                ACTION_STREAM, self.subjects.action(job), ActionRecord, limit=READ_LIMIT
            )
        except (StreamMissing, BusError, asyncio.TimeoutError) as exc:
            log.warning("action records unreadable", job=job, error=str(exc))
            return []
        return list(replay.items)

    async def recorded_ids(self, job: str) -> set[str]:
        """Action ids already on ANTDT_ACTIONS for the job (empty when unreadable)."""
        return {r.action_id for r in await self.recorded(job)}


def _not_persisted(record: ActionRecord, tries: int, error: Exception) -> None:
    log.warning(
        "action record not persisted", action=record.action_id, tries=tries, error=str(error)
    )
