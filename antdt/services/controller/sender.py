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
#: Jobs of this many ranks or more get an AdjustBatch broadcast first (`CommandSender`).
BROADCAST_FROM = 128
#: Rejection counters (pattern) of replies that are not acks, per command kind.
ACK_PATTERNS = {AdjustBatch: "adjust_ack", KillRestart: "kill_restart_ack"}


class CommandSender:
    """A KillRestart is broadcast on the job's subject and its replies gathered. An
    AdjustBatch goes to each rank's subject (a span per attempt), except to a job of
    `broadcast_from` ranks or more: there it is broadcast once (each rank a copy of the
    plan from one publish, not one request of it per rank), and the ranks that did not
    ack it are then asked on their own subjects."""

    def __init__(
        self,
        bus: Bus,
        subjects: Subjects,
        *,
        ack_timeout_s: float,
        ack_deadline_s: float,
        broadcast_from: int,
    ) -> None:
        self.bus = bus
        self.subjects = subjects
        self.ack_timeout_s = ack_timeout_s
        self.ack_deadline_s = ack_deadline_s
        self.broadcast_from = broadcast_from

    async def send(self, command: Command, world_size: int) -> AckTally:
        tally = AckTally(command, world_size)
        deadline = time.monotonic() + self.ack_deadline_s
        broadcast = isinstance(command, KillRestart) or world_size >= self.broadcast_from
        while not tally.complete and time.monotonic() < deadline:
            if broadcast:
                await self._broadcast(tally, command, deadline)
                broadcast = isinstance(command, KillRestart)
            else:
                assert isinstance(command, AdjustBatch)
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

    async def _broadcast(self, tally: AckTally, command: Command, deadline: float) -> None:
        subject = self.subjects.command_all(command.job)
        seen = 0
        # An AdjustBatch's ranks that answered with no ack are asked next on their own
        # subjects: no need to wait out the timeout once every rank has answered.
        answers = tally.world_size if isinstance(command, AdjustBatch) else None

        def done(replies: list[Ack | ErrorReply]) -> bool:
            nonlocal seen
            for reply in replies[seen:]:
                self._count(tally, reply, subject, None)
            seen = len(replies)
            return tally.complete or (answers is not None and seen >= answers)

        timeout = min(self.ack_timeout_s, max(0.01, deadline - time.monotonic()))
        with tracing.broadcast(subject, command) as acked:
            try:
                await self.bus.gather(subject, command, Ack, timeout=timeout, done=done)
            except BusError as exc:
                log.info("broadcast failed", job=command.job, error=str(exc))
            acked(len(tally.ok), len(tally.pending))

    def _count(
        self, tally: AckTally, reply: Ack | ErrorReply, subject: str, sent_to: int | None
    ) -> None:
        reason = tally.add(reply, sent_to)
        if reason:
            pattern = ACK_PATTERNS[type(tally.command)]
            self.bus.rejections.record(pattern, ErrorCode.BAD_ACK, reason, subject)
