"""Publishing incidents off the path of step events: one task, in the order they come.

An incident goes to JetStream (ANTDT_INCIDENTS), which answers each publish with an
ack. Awaited in the step handler, that ack held the ingestion of every job's steps: a
replica behind on step events read the ack only after every event queued before it on
the same connection, so each transition (a stall resolving as its rank's steps came
back) waited up to a second there while the step subscription's queue overflowed. Here
the handler only queues the incident, and a task publishes the queue in order, so an
incident's transitions keep their order (opened, escalated, resolved).

The queue is bounded: past MAX_QUEUED (JetStream away for long on a job with many
ranks) whoever queues waits for room, as every handler waited before.
"""

from __future__ import annotations

import asyncio

import structlog

from antdt.runtime.bus import Bus
from antdt.runtime.telemetry.tracing import IncidentTraces
from antdt.schemas import Incident, Subjects

log = structlog.get_logger("antdt.monitor")

#: Incidents queued for publishing at most; then queueing waits for room.
MAX_QUEUED = 10_000
#: Incidents published at once, their acks awaited together.
MAX_IN_FLIGHT = 64


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
        """Run as a task: publish what is queued, in order, up to MAX_IN_FLIGHT at once.

        Their publishes go out in queue order on the one connection, so JetStream stores
        them in that order; they only wait for their acks together. One at a time, each
        waited for its own ack: several loop turns, which a replica busy with a backlog of
        step events gives every few tens of ms (63 stalls resolving took 5 s)."""
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
        msg_id = f"{incident.id}-{incident.state.value}-{incident.windows}"
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
