"""The span helpers of antdt.runtime.telemetry.tracing(_agent) on a private tracer provider with an
in-memory exporter: who parents whom, what each span says, when the effect and the
apply spans are emitted."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from antdt.agent.outbox import StepRecord
from antdt.runtime.telemetry.tracing import DecisionTraces, IncidentTraces
from antdt.runtime.telemetry.tracing_agent import AgentTraces
from antdt.schemas import (
    ActionRecord,
    ActionResult,
    AdjustBatch,
    Incident,
    IncidentKind,
    IncidentState,
    JobHealth,
    Plan,
)

NOW = 1.7e9
AGENT = "antdt.agent"


Exported = tuple[TracerProvider, InMemorySpanExporter]


@pytest.fixture
def exported() -> Exported:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _incident(state: IncidentState, step: int = 20) -> Incident:
    return Incident(
        id="j-r3-slow-1",
        job="j",
        rank=3,
        host="h3",
        kind=IncidentKind.SLOW,
        state=state,
        step=step,
        opened_at=NOW,
        updated_at=NOW,
        ratio=2.5,
        windows=3,
    )


def _health(step: int, samples_per_s: float, version: int) -> JobHealth:
    return JobHealth(
        job="j",
        at=NOW + step,
        step=step,
        step_s=0.2,
        samples_per_s=samples_per_s,
        balance_efficiency=0.5,
        plan_version=version,
        ranks=(),
    )


def _record(version: int, effective_step: int) -> ActionRecord:
    return ActionRecord(
        action_id=f"j-plan-{version}",
        job="j",
        kind="adjust_batch",
        policy="lb-bsp",
        reason="r",
        incident_id="j-r3-slow-1",
        plan_version=version,
        local_batch=(3, 3, 3, 1),
        effective_step=effective_step,
        decided_at=NOW,
        completed_at=NOW + 0.05,
        result=ActionResult.APPLIED,
        acked_ranks=(0, 1, 2, 3),
    )


@dataclass(frozen=True)
class _Action:
    action_id: str
    incident_id: str | None


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent else None


def test_incident_transitions_share_the_trace_of_the_first(exported: Exported) -> None:
    provider, exporter = exported
    traces = IncidentTraces(provider=provider)
    for state in (IncidentState.OPENED, IncidentState.ESCALATED, IncidentState.RESOLVED):
        with traces.transition(_incident(state), "p.j.incident", f"id-{state.value}"):
            pass
    opened, escalated, resolved = exporter.get_finished_spans()
    assert [s.name for s in (opened, escalated, resolved)] == [
        "incident opened",
        "incident escalated",
        "incident resolved",
    ]
    assert opened.parent is None
    assert _parent(escalated) == _parent(resolved) == opened.context.span_id
    assert {s.context.trace_id for s in (opened, escalated, resolved)} == {opened.context.trace_id}
    attrs = opened.attributes or {}
    assert attrs["antdt.incident.id"] == "j-r3-slow-1" and attrs["antdt.rank"] == 3
    assert attrs["messaging.system"] == "nats"
    assert attrs["messaging.destination.name"] == "p.j.incident"
    assert attrs["messaging.message.id"] == "id-opened"
    # resolved: forgotten, so the same id later starts a new trace
    with traces.transition(_incident(IncidentState.OPENED), "p.j.incident", "again"):
        pass
    assert exporter.get_finished_spans()[-1].parent is None


def test_a_large_jobs_decide_span_sums_its_plan_up_and_lists_the_ranks_not_acked(
    exported: Exported,
) -> None:
    """10,000 batches and acked ranks as attributes made each decide span ~100 kB: past
    LISTED_RANKS ranks the span carries the plan's count, min, max and sum, the acks
    counted and the ranks that did not ack (up to LISTED_RANKS of them)."""
    provider, exporter = exported
    traces = DecisionTraces(effect_steps=16, provider=provider)
    world, silent = 10_000, (17, 9_999)
    record = _record(1, effective_step=25).model_copy(
        update={
            "local_batch": (4,) * (world - 1) + (5,),
            "acked_ranks": tuple(r for r in range(world) if r not in silent),
            "missing_ranks": silent,  # as records.missing lists them
            "result": ActionResult.PARTIAL,
        }
    )
    with (
        traces.decide("j", "lb-bsp", _health(20, 1000.0, 0)) as decision,
        decision.action(_Action("j-plan-1", "j-r3-slow-1")),
    ):
        decision.done(record, None)
    (decide,) = [s for s in exporter.get_finished_spans() if s.name == "decide lb-bsp"]
    attrs = dict(decide.attributes or {})
    assert "antdt.plan.local_batch" not in attrs and "antdt.action.acked_ranks" not in attrs
    assert {k: attrs[k] for k in attrs if k.startswith("antdt.plan.local_batch.")} == {
        "antdt.plan.local_batch.ranks": world,
        "antdt.plan.local_batch.min": 4,
        "antdt.plan.local_batch.max": 5,
        "antdt.plan.local_batch.sum": 4 * world + 1,
    }
    assert attrs["antdt.action.acked_count"] == world - 2
    assert tuple(attrs["antdt.action.unacked_ranks"]) == silent  # type: ignore[arg-type]


def test_a_decision_on_health_joins_the_incident_trace_and_measures_its_effect(
    exported: Exported,
) -> None:
    provider, exporter = exported
    traces = DecisionTraces(effect_steps=16, provider=provider)
    tracer = provider.get_tracer("monitor")
    with tracer.start_as_current_span("incident opened") as root:  # as the bus attaches it
        traces.incident(_incident(IncidentState.OPENED))
    before = _health(20, 1000.0, 0)
    with (
        traces.decide("j", "lb-bsp", before) as decision,
        decision.action(_Action("j-plan-1", "j-r3-slow-1")),
    ):
        decision.done(_record(1, effective_step=25), before)
    (decide,) = [s for s in exporter.get_finished_spans() if s.name == "decide lb-bsp"]
    assert decide.context.trace_id == root.get_span_context().trace_id
    assert _parent(decide) == root.get_span_context().span_id
    attrs = decide.attributes or {}
    assert attrs["antdt.trigger"] == "health" and attrs["antdt.action.result"] == "applied"
    assert tuple(attrs["antdt.plan.local_batch"]) == (3, 3, 3, 1)  # type: ignore[arg-type]

    traces.health(_health(40, 1500.0, 1))  # before effective_step + 16: not yet
    assert not [s for s in exporter.get_finished_spans() if s.name == "effect"]
    traces.health(_health(41, 1500.0, 1))
    (effect,) = [s for s in exporter.get_finished_spans() if s.name == "effect"]
    assert _parent(effect) == decide.context.span_id
    attrs = effect.attributes or {}
    assert attrs["antdt.effect.samples_per_s.before"] == 1000.0
    assert attrs["antdt.effect.samples_per_s.after"] == 1500.0
    assert attrs["antdt.effect.speedup"] == pytest.approx(1.5)
    traces.health(_health(60, 1500.0, 1))  # measured once
    assert len([s for s in exporter.get_finished_spans() if s.name == "effect"]) == 1
    assert len(traces._effects) == 0  # nothing awaited: the job is forgotten


def test_effects_awaited_for_jobs_that_never_report_again_stay_bounded(
    exported: Exported, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that ends (or moves to another replica) before its effect is measured must
    not keep its entry, with the health before each action, for the controller's life."""
    import antdt.runtime.telemetry.tracing as tracing

    monkeypatch.setattr(tracing, "MAX_JOBS", 3)
    provider, _ = exported
    traces = DecisionTraces(provider=provider)
    parent = provider.get_tracer("t").start_span("decide").get_span_context()
    for job in range(5):
        record = _record(1, effective_step=25).model_copy(update={"job": f"j{job}"})
        traces.expect_effect(record, parent, _health(20, 1000.0, 0))
    assert len(traces._effects) == 3 and "j4" in traces._effects and "j0" not in traces._effects


def test_an_incident_without_action_still_gets_a_decision_span(exported: Exported) -> None:
    provider, exporter = exported
    traces = DecisionTraces(provider=provider)
    incident = _incident(IncidentState.OPENED)
    tracer = provider.get_tracer("m")
    with (
        tracer.start_as_current_span("incident opened") as root,
        traces.decide("j", "none", incident),
    ):
        pass  # the policy proposed nothing
    (decide,) = [s for s in exporter.get_finished_spans() if s.name == "decide none"]
    assert _parent(decide) == root.get_span_context().span_id
    assert (decide.attributes or {})["antdt.action.kind"] == "none"
    with traces.decide("j", "none", _health(5, 1.0, 0)):
        pass  # a periodic health with no action: no span
    assert len(exporter.get_finished_spans()) == 2  # the root and the decision


def _agent(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    spans = exporter.get_finished_spans()
    return [
        s
        for s in spans
        if s.instrumentation_scope and s.instrumentation_scope.name == "antdt.agent"
    ]


def _step(step: int, version: int) -> StepRecord:
    return StepRecord(
        step=step,
        epoch=0,
        plan_version=version,
        local_batch=3,
        samples=3,
        data_wait_s=0.0,
        comm_s=0.01,
        step_s=0.1,
        started_at=NOW + step,
    )


def test_agent_spans_process_then_apply_at_the_first_step_under_the_plan(
    exported: Exported,
) -> None:
    provider, exporter = exported
    traces = AgentTraces("j", 2, provider)
    plan = Plan(
        job="j",
        version=1,
        local_batch=(3, 3, 3, 1),
        effective_step=12,
        reason="r",
        policy="lb-bsp",
        created_at=NOW,
    )
    cmd = AdjustBatch(action_id="j-plan-1", job="j", plan=plan, incident_id="j-r3-slow-1")
    with provider.get_tracer("c").start_as_current_span("send adjust_batch") as send:
        traces.command(cmd, "p.j.cmd.2", "accept", 12)
    traces.stepped([_step(10, 0), _step(11, 0)])
    assert [s.name for s in _agent(exporter)] == ["process adjust_batch"]
    traces.stepped([_step(12, 1), _step(13, 1)])
    process, apply = _agent(exporter)
    assert _parent(process) == send.get_span_context().span_id
    assert _parent(apply) == process.context.span_id and apply.name == "apply plan"
    attrs = apply.attributes or {}
    assert attrs["antdt.step"] == 12 and attrs["antdt.plan.applied_step"] == 12
    assert attrs["antdt.rank"] == 2 and attrs["antdt.incident.id"] == "j-r3-slow-1"
    assert apply.start_time == int((NOW + 12) * 1e9)
    # a plan superseded before its step: no apply span for it
    traces.command(cmd.model_copy(update={"action_id": "j-plan-2"}), "s", "accept", 20)
    traces.stepped([_step(20, 3)])
    assert [s.name for s in _agent(exporter)][2:] == ["process adjust_batch"]


def test_no_provider_installed_costs_nothing_and_fails_nothing() -> None:
    traces = AgentTraces("j", 0, trace.NoOpTracerProvider())
    plan = Plan(
        job="j",
        version=1,
        local_batch=(1,),
        effective_step=1,
        reason="r",
        policy="none",
        created_at=NOW,
    )
    traces.command(AdjustBatch(action_id="a", job="j", plan=plan), "s", "accept", 1)
    assert not traces._pending  # a no-op span has no context to wait on
    traces.stepped([_step(1, 1)])


def test_trace_headers_carry_the_current_context_and_nothing_without_one() -> None:
    from opentelemetry import baggage
    from opentelemetry import context as otel_context

    from antdt.runtime.bus.messages import trace_headers

    assert trace_headers() == {}
    assert trace_headers({"x-antdt": "1"}) == {"x-antdt": "1"}
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("request"):
        assert trace_headers({"x-antdt": "1"})["traceparent"].startswith("00-")
    token = otel_context.attach(baggage.set_baggage("tenant", "a"))
    try:  # baggage alone, no span: still sent
        assert trace_headers() == {"baggage": "tenant=a"}
    finally:
        otel_context.detach(token)
