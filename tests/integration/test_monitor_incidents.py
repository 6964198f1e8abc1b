"""The monitor publishes incidents from a task of their own (incidents.py), off the path
of step events: against real JetStream, they are stored in the order they were queued
(in batches whose acks are awaited together), `flushed` means stored, and a replica that
shuts down publishes what it had queued before its connection closes."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.store import Store
from antdt.runtime.telemetry.tracing import IncidentTraces
from antdt.schemas import INCIDENT_STREAM, Incident, IncidentKind, IncidentState, Subjects
from antdt.services.monitor.incidents import MAX_IN_FLIGHT, IncidentPublisher
from antdt.services.monitor.service import MonitorService, MonitorSettings

pytestmark = pytest.mark.integration

STATES = (IncidentState.OPENED, IncidentState.ESCALATED, IncidentState.RESOLVED)


def transitions(job: str, count: int) -> list[Incident]:
    """`count` transitions of incidents of `job`, each incident opened, escalated, resolved."""
    made = []
    for n in range(count):
        made.append(
            Incident(
                id=f"{job}-r{n // 3}",
                job=job,
                rank=n // 3 % 8,
                host="h",
                kind=IncidentKind.SLOW,
                state=STATES[n % 3],
                step=n,
                opened_at=1.7e9,
                updated_at=1.7e9 + n,
                ratio=2.0,
                windows=n,
            )
        )
    return made


async def test_incidents_are_stored_in_the_order_queued_and_flushed_means_stored(
    bus: Bus, unique: str
) -> None:
    subjects = Subjects(bus.settings.subject_prefix)
    stream = f"I_{unique}"
    await bus.jetstream.ensure_stream(stream, [subjects.incident("ip")], max_age_s=60)
    publisher = IncidentPublisher(bus, subjects, IncidentTraces(provider=TracerProvider()))
    running = asyncio.create_task(publisher.run())
    queued = transitions("ip", 3 * MAX_IN_FLIGHT + 7)  # several batches, the last partial
    try:
        for incident in queued:
            await publisher.put(incident)
        await asyncio.wait_for(publisher.flushed(), timeout=30)
        stored = await bus.jetstream.read(stream, subjects.incident("ip"), Incident)
    finally:
        running.cancel()
    assert stored.items == queued
    assert publisher.published == len(queued) and publisher.queued == 0


async def test_a_replica_shutting_down_publishes_what_it_had_queued(
    settings: ServiceSettings, bus: Bus
) -> None:
    monitor_settings = MonitorSettings(**settings.model_dump())
    runtime = ServiceRuntime("test-monitor")
    store = await Store(monitor_settings.etcd).connect()
    monitor_bus = await Bus(monitor_settings.nats, name="test-monitor").connect()
    monitor = MonitorService(monitor_settings, monitor_bus, store)
    await monitor.start(runtime)
    queued = transitions("down", 2000)
    for incident in queued:
        await monitor.incidents.put(incident)
    await runtime.shutdown()  # at once: most of them are still queued
    await store.close()
    subjects = Subjects(settings.nats.subject_prefix)
    stored = await bus.jetstream.read(INCIDENT_STREAM, subjects.incident("down"), Incident)
    assert stored.items == queued
    assert not monitor_bus.connected and not monitor.ranks_bus.connected
