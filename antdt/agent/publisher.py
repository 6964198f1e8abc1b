"""The loop's side of the outbox: step events to the bus, sample-log lines to the file.
The training thread only appends and schedules one drain; step events are dropped and
counted when the bus is down, sample-log lines never (they are the accounting).

Step events go out in batches, `event_flush_s` after the first of a batch (or at once
when the queue is half full): a wake of the loop per step costs the training thread more
than the step's own bookkeeping. Sample-log lines are written at once."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import IO, Any

import structlog

from antdt.agent.loopthread import LoopThread
from antdt.agent.outbox import BoundedQueue, RestoreMark, SampleLine, StepRecord
from antdt.agent.settings import AgentSettings
from antdt.runtime.bus import Bus
from antdt.schemas import StepEvent

log = structlog.get_logger("antdt.agent")


class Publisher:
    def __init__(
        self,
        settings: AgentSettings,
        subject: str,
        *,
        thread: LoopThread,
        bus: Bus,
        incarnation: Callable[[], int],
        on_records: Callable[[list[Any]], None],
        link_rtt: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.settings = settings
        self._subject = subject
        self._thread = thread
        self._bus = bus
        self._incarnation = incarnation  # the shard stream's: labels sample-log lines
        self._on_records = on_records  # tracing: the span of a plan's first step
        self._link_rtt = link_rtt  # the latest measure of the rank's link (LinkProbe)
        self.events: BoundedQueue[StepRecord] = BoundedQueue(settings.event_queue_max)
        self._lines: deque[SampleLine | RestoreMark] = deque()
        self._scheduled = False  # a drain at once is on its way to the loop
        self._later = False  # a drain after event_flush_s is armed or on its way
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._file: IO[str] | None = None

    # -- training thread -----------------------------------------------------------------

    def emit(self, record: StepRecord) -> None:
        if self.events.put(record):
            flush_s = self.settings.event_flush_s
            if flush_s == 0 or len(self.events) * 2 >= self.events.maxlen:
                self._schedule()
            elif not self._later:
                self._later = True
                self._thread.call_soon(self._arm, flush_s)

    def log_ids(self, line: SampleLine | RestoreMark) -> None:  # never dropped
        self._lines.append(line)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._thread.call_soon(self._start)

    # -- loop ------------------------------------------------------------------------------

    def _arm(self, delay_s: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._start_timed)

    def _start_timed(self) -> None:
        self._timer = None
        self._later = False  # before the drain pops: an event put after it wakes again
        self._drain_soon()

    def _start(self) -> None:
        self._scheduled = False
        self._drain_soon()

    def _drain_soon(self) -> None:
        # A running drain pops again after each await, so it will see the new items.
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.drain())

    async def finish(self) -> None:
        """Wait for a running drain, then drain what is left."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._later = False
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        await self.drain()

    def close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    async def drain(self) -> None:
        """Publish queued step events and write sample-log lines until both are empty."""
        while True:
            records, lines = self.events.pop_all(), self._pop_lines()
            if not records and not lines:
                return
            self._write_lines(lines)
            await self._publish(records)

    def _pop_lines(self) -> list[SampleLine | RestoreMark]:
        out: list[SampleLine | RestoreMark] = []
        while self._lines:
            out.append(self._lines.popleft())
        return out

    async def _publish(self, records: list[StepRecord]) -> None:
        bus = self._bus
        if not records:
            return
        self._on_records(records)
        if not bus.connected:
            self.events.drop(len(records))  # the bus is down: drop, never buffer unboundedly
            return
        for record in records:
            try:
                await bus.publish(self._subject, self._step_event(record))
            except Exception as exc:
                self.events.drop(1)
                if self.events.dropped_later == 1:
                    log.warning("step event not published", error=str(exc))

    def _step_event(self, r: StepRecord) -> StepEvent:
        s = self.settings
        return step_event(r, s.job, s.rank, s.host, self._link_rtt())

    def _write_lines(self, lines: list[SampleLine | RestoreMark]) -> None:
        if not lines or not self.settings.sample_log:
            return
        if self._file is None:
            path = f"{self.settings.sample_log}.rank{self.settings.rank}.jsonl"
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (lives with the agent)
        k = self._incarnation()
        for line in lines:
            if isinstance(line, RestoreMark):
                step = "null" if line.step is None else line.step
                self._file.write(f'{{"incarnation":{k},"restored":{step}}}\n')
                continue
            ids = ",".join(map(str, line.ids))
            self._file.write(
                f'{{"incarnation":{k},"epoch":{line.epoch},"step":{line.step},"ids":[{ids}]}}\n'
            )
        self._file.flush()  # a rank killed later must not lose lines of synced steps


def step_event(
    r: StepRecord, job: str, rank: int, host: str, link_rtt_s: float | None = None
) -> StepEvent:
    """A finished step's event: compute is the wall time less data wait and exchange,
    spent on the `samples` this rank computed (others' too, under work sharing), so
    compute_s / samples is the rank's own speed."""
    return StepEvent(
        link_rtt_s=link_rtt_s,
        job=job,
        rank=rank,
        host=host,
        step=r.step,
        epoch=r.epoch,
        plan_version=r.plan_version,
        local_batch=r.local_batch,
        samples=r.samples,
        compute_s=max(0.0, r.step_s - r.data_wait_s - r.comm_s),
        data_wait_s=r.data_wait_s,
        comm_s=r.comm_s,
        step_s=r.step_s,
        started_at=r.started_at,
        ended_at=r.started_at + r.step_s,
        helped=dict(r.helped) if r.helped else None,
        one_piece_s=r.one_piece_s,
    )
