"""Publishing off the path of step events: a job's health at once, its incident
transitions queued and published to JetStream (ANTDT_INCIDENTS) in order by one task, so
that awaiting JetStream's acks never holds up ingestion. The queue is bounded
(MAX_QUEUED): past it whoever queues waits for room."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import structlog

from antdt.runtime.bus import Bus
from antdt.runtime.telemetry.tracing import IncidentTraces
from antdt.schemas import Incident, JobHealth, Subjects
from antdt.services.monitor.detector import JobDetector

log = structlog.get_logger("antdt.monitor")

#: Incidents queued for publishing at most; then queueing waits for room.
MAX_QUEUED = 10_000
#: Incidents published at once, their acks awaited together.
MAX_IN_FLIGHT = 64
#: How long a job handed over waits, at most, for its transitions under way to be on
#: ANTDT_INCIDENTS before its key goes, seconds (then it goes anyway, logged).
SETTLE_TIMEOUT_S = 5.0


class IncidentPublisher:
    """Publishes queued incidents, in order, from one task (`run`)."""

    def __init__(self, bus: Bus, subjects: Subjects, traces: IncidentTraces) -> None:
        self._bus = bus
        self._subjects = subjects
        self._traces = traces
        self._queue: asyncio.Queue[Incident] = asyncio.Queue(MAX_QUEUED)
        self.published = 0  # incidents published (to JetStream, or core NATS failing that)
        self._queued_total = 0  # incidents ever queued ...
        self._done_total = 0  # ... and ever done with (published or given up), in order
        self._done = asyncio.Condition()

    @property
    def queued(self) -> int:
        """Incidents waiting to be published."""
        return self._queue.qsize()

    async def put(self, incident: Incident) -> None:
        """Queue `incident`; waits only while MAX_QUEUED are queued already."""
        await self._queue.put(incident)
        self._queued_total += 1

    async def flushed(self) -> None:
        """Return once every incident queued so far is published (not waiting for those
        queued later: under a steady stream of incidents the queue may never be empty)."""
        target = self._queued_total
        async with self._done:
            await self._done.wait_for(lambda: self._done_total >= target)

    async def run(self) -> None:
        """Run as a task: publish what is queued, in order, up to MAX_IN_FLIGHT at once:
        they go out in queue order on one connection, and only their acks are awaited
        together."""
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_IN_FLIGHT and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            await asyncio.gather(*(self._publish_one(incident) for incident in batch))
            async with self._done:
                self._done_total += len(batch)
                self._done.notify_all()

    async def _publish_one(self, incident: Incident) -> None:
        try:
            await self._publish(incident)
        except Exception as exc:  # core NATS away too: nothing more to do for it
            log.warning("incident not published", incident=incident.id, error=str(exc))

    async def _publish(self, incident: Incident) -> None:
        msg_id = transition_id(incident)
        subject = self._subjects.incident(incident.job)
        with self._traces.transition(incident, subject, msg_id):  # its headers carry the trace
            try:
                await self._bus.jetstream.publish(subject, incident, msg_id=msg_id)
            except Exception as exc:  # JetStream briefly away: core subscribers still get it
                log.warning("incident not persisted", incident=incident.id, error=str(exc))
                await self._bus.publish(subject, incident)
            self.published += 1
            log.info(
                "incident",
                job=incident.job,
                incident=incident.id,
                rank=incident.rank,
                kind=incident.kind.value,
                state=incident.state.value,
                ratio=round(incident.ratio, 3),
            )


def transition_id(incident: Incident) -> str:
    """The JetStream de-duplication id of one transition: a retry of it is dropped, the
    next one is not. A host named in the incident (its `host_ranks`, which only grow) is
    a transition of its own: its state and windows may not have moved."""
    msg_id = f"{incident.id}-{incident.state.value}-{incident.windows}"
    return f"{msg_id}-h{len(incident.host_ranks)}" if incident.host_ranks else msg_id


class Outbox:
    """What the monitor sends about a job: its health, then its new transitions (queued,
    in order), so that whoever reacts to an incident sees the window that opened it."""

    def __init__(self, bus: Bus, subjects: Subjects, publisher: IncidentPublisher) -> None:
        self._bus = bus
        self._subjects = subjects
        self._publisher = publisher
        self._sending: Counter[str] = Counter()  # job -> sends under way

    async def send(self, detector: JobDetector, incidents: list[Incident], now: float) -> JobHealth:
        """Counted while under way, with no turn given before the count (`settled`)."""
        job = detector.job
        self._sending[job] += 1
        try:
            health = detector.health(now)
            await self._bus.publish(self._subjects.health(job), health)
            for incident in incidents:
                await self._publisher.put(incident)
            return health
        finally:
            self._sending[job] -= 1
            if not self._sending[job]:
                del self._sending[job]

    async def settled(self, job: str) -> None:
        """Return once no send of `job` is under way and every transition queued is
        published (at most SETTLE_TIMEOUT_S: then TimeoutError)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while self._sending[job] and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        timeout = max(0.0, deadline - time.monotonic())
        await asyncio.wait_for(self._publisher.flushed(), timeout)
