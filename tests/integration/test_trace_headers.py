"""An incident's trace context travels with it through JetStream: the monitor's span is
current while the incident is published, so the copy stored in the stream carries its
`traceparent`, and a handler receiving it (live or replayed later) runs under it."""

from __future__ import annotations

import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.coordination.leftopen import open_incidents
from antdt.runtime.telemetry.tracing import IncidentTraces
from antdt.schemas import INCIDENT_STREAM, Incident, IncidentKind, IncidentState, Subjects
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


def _incident(job: str) -> Incident:
    return Incident(
        id=f"{job}-r1-slow-1",
        job=job,
        rank=1,
        host="h1",
        kind=IncidentKind.SLOW,
        state=IncidentState.OPENED,
        step=9,
        opened_at=1.7e9,
        updated_at=1.7e9,
        ratio=2.0,
        windows=3,
    )


async def test_incident_trace_context_is_stored_in_jetstream(bus: Bus, unique: str) -> None:
    subjects = Subjects(bus.settings.subject_prefix)
    subject, stream = subjects.incident("tj"), f"T_{unique}"
    await bus.jetstream.ensure_stream(stream, [subject], max_age_s=60)
    seen: list[tuple[int, Delivery]] = []

    async def on_incident(_: Incident, delivery: Delivery) -> None:
        seen.append((trace.get_current_span().get_span_context().trace_id, delivery))

    await bus.subscribe(subject, Incident, on_incident)
    traces = IncidentTraces(provider=TracerProvider())
    with traces.transition(_incident("tj"), subject, "m1") as span:
        await bus.jetstream.publish(subject, _incident("tj"), msg_id="m1")
    trace_id = format(span.get_span_context().trace_id, "032x")
    span_id = format(span.get_span_context().span_id, "016x")

    stored = await bus.nc.jetstream().get_last_msg(stream, subject)
    assert stored.headers is not None
    assert stored.headers["traceparent"].startswith(f"00-{trace_id}-{span_id}-")
    await wait_for(lambda: seen, what="live delivery")
    assert format(seen[0][0], "032x") == trace_id  # the handler ran inside the trace

    replay = await bus.nc.jetstream().pull_subscribe(subject, stream=stream)
    (msg,) = await replay.fetch(1, timeout=2)
    assert (msg.headers or {})["traceparent"].split("-")[1] == trace_id
    await replay.unsubscribe()


async def test_an_incident_carried_on_by_another_replica_stays_in_its_trace(
    bus: Bus, unique: str
) -> None:
    """Replica A opens an incident and dies; replica B reads it back from ANTDT_INCIDENTS
    (as at a take-over) with the span it was published under, and B's resolution of it
    is a child of A's root span: one trace for the whole incident in Jaeger."""
    subjects, job = Subjects(bus.settings.subject_prefix), f"tr{unique}"
    subject = subjects.incident(job)
    await bus.jetstream.ensure_stream(INCIDENT_STREAM, [subjects.any_job("incident")])
    provider, spans = TracerProvider(), InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    opened = _incident(job)
    with IncidentTraces(provider=provider).transition(opened, subject, "m1") as root:
        await bus.jetstream.publish(subject, opened, msg_id="m1")

    (left,) = await open_incidents(bus, subjects, job, time.time())
    sent = root.get_span_context()
    assert left.incident == opened and left.trace is not None
    assert (left.trace.trace_id, left.trace.span_id) == (sent.trace_id, sent.span_id)
    replica_b = IncidentTraces(provider=provider)
    replica_b.adopt(opened.id, left.trace)
    resolved = opened.model_copy(update={"state": IncidentState.RESOLVED})
    with replica_b.transition(resolved, subject, "m2") as later:
        await bus.jetstream.publish(subject, resolved, msg_id="m2")
    assert later.get_span_context().trace_id == sent.trace_id
    assert later.parent is not None and later.parent.span_id == sent.span_id
    assert [s.name for s in spans.get_finished_spans()] == ["incident opened", "incident resolved"]
    assert await open_incidents(bus, subjects, job, time.time()) == []


async def test_incidents_not_read_whole_are_refused_not_taken_as_all(
    bus: Bus, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take-over that cannot read every transition of a job (past the read's limit
    even from its latest start) raises, rather than take the oldest for all: the ones
    left out are the newest, those that resolve."""
    from antdt.runtime.bus import BusError
    from antdt.runtime.coordination import leftopen

    subjects, job = Subjects(bus.settings.subject_prefix), f"whole{unique}"
    subject = subjects.incident(job)
    await bus.jetstream.ensure_stream(INCIDENT_STREAM, [subjects.any_job("incident")])
    opened = _incident(job)
    resolved = opened.model_copy(update={"state": IncidentState.RESOLVED})
    await bus.jetstream.publish(subject, opened, msg_id=f"{job}-1")
    await bus.jetstream.publish(subject, resolved, msg_id=f"{job}-2")
    assert await open_incidents(bus, subjects, job, time.time()) == []
    monkeypatch.setattr(leftopen, "READ_LIMIT", 1)
    monkeypatch.setattr(leftopen, "LOOKBACKS_S", (None,))
    with pytest.raises(BusError, match="not read whole: 1 of 2"):
        await open_incidents(bus, subjects, job, time.time())
