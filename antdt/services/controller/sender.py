"""Commands to every rank of a job, their acks tallied in one `AckTally`, sent again
until every rank answered or the ack deadline passed."""

from __future__ import annotations

import asyncio
import time

import structlog

from antdt.runtime.bus import Bus, BusError
from antdt.runtime.telemetry import tracing
from antdt.schemas import Ack, AdjustBatch, ErrorCode, ErrorReply, KillRestart, Subjects
from antdt.services.controller.acks import AckTally, Command

log = structlog.get_logger("antdt.controller.sender")
#: Pause between two rounds of sending to the ranks that have not answered.
RETRY_PAUSE_S = 0.05
#: Rejection counters (pattern) of replies that are not acks, per command kind.
ACK_PATTERNS = {AdjustBatch: "adjust_ack", KillRestart: "kill_restart_ack"}


class CommandSender:
    """An AdjustBatch goes to each rank's subject (a span per attempt); a KillRestart is
    broadcast on the job's subject and its replies gathered."""

    def __init__(
        self, bus: Bus, subjects: Subjects, *, ack_timeout_s: float, ack_deadline_s: float
    ) -> None:
        self.bus = bus
        self.subjects = subjects
        self.ack_timeout_s = ack_timeout_s
        self.ack_deadline_s = ack_deadline_s

    async def send(self, command: Command, world_size: int) -> AckTally:
        tally = AckTally(command, world_size)
        deadline = time.monotonic() + self.ack_deadline_s
        while not tally.complete and time.monotonic() < deadline:
            if isinstance(command, KillRestart):
                await self._broadcast(tally, command, deadline)
            else:
                await asyncio.gather(*(self._request(tally, command, r) for r in tally.pending))
            if not tally.complete:
                await asyncio.sleep(RETRY_PAUSE_S)
        return tally

    async def _request(self, tally: AckTally, command: AdjustBatch, rank: int) -> None:
        subject = self.subjects.command(command.job, rank)
        with tracing.send(subject, command, rank) as sent:  # a span per attempt, a child per ack
            try:
                ack = await self.bus.request(subject, command, Ack, timeout=self.ack_timeout_s)
            except BusError as exc:
                log.info("no ack", job=command.job, rank=rank, error=str(exc))
                return
            sent(ack)
        self._count(tally, ack, subject, rank)

    async def _broadcast(self, tally: AckTally, command: KillRestart, deadline: float) -> None:
        subject = self.subjects.command_all(command.job)
        seen = 0

        def done(replies: list[Ack | ErrorReply]) -> bool:
            nonlocal seen
            for reply in replies[seen:]:
                self._count(tally, reply, subject, None)
            seen = len(replies)
            return tally.complete

        timeout = min(self.ack_timeout_s, max(0.01, deadline - time.monotonic()))
        try:
            await self.bus.gather(subject, command, Ack, timeout=timeout, done=done)
        except BusError as exc:
            log.info("broadcast failed", job=command.job, error=str(exc))

    def _count(
        self, tally: AckTally, reply: Ack | ErrorReply, subject: str, sent_to: int | None
    ) -> None:
        reason = tally.add(reply, sent_to)
        if reason:
            pattern = ACK_PATTERNS[type(tally.command)]
            self.bus.rejections.record(pattern, ErrorCode.BAD_ACK, reason, subject)
