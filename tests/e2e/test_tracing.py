"""One straggler incident is one trace, across processes: the session's real 2-rank job
(tests/e2e/conftest.py) exports its spans to a real OTLP/gRPC receiver in this process;
the services run here, the ranks are separate processes.

The trace of the incident that led to the first applied action must hold the monitor's
incident span (the root), the controller's decision with one command per rank and each
rank's ack, and on every rank the command processed and the plan applied at the plan's
effective step, each span the child of the one that caused it; then the effect."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from antdt.schemas import ActionResult
from tests.e2e.conftest import WORLD, StragglerRun, Telemetry
from tests.helpers import wait_for
from tests.otlp_receiver import ReceivedSpan

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.integration]


def _of(spans: list[ReceivedSpan], name: str, **attributes: Any) -> list[ReceivedSpan]:
    return [
        s
        for s in spans
        if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
    ]


async def test_one_incident_is_one_trace_from_monitor_to_every_rank(
    straggler_run: StragglerRun, telemetry: Telemetry
) -> None:
    run, receiver = straggler_run, telemetry.receiver
    assert run.rc == 0
    action = next(
        a for a in run.actions if a.result == ActionResult.APPLIED and a.incident_id is not None
    )
    ids = {"antdt.job": run.job, "antdt.action.id": action.action_id}

    def complete() -> list[ReceivedSpan] | None:
        spans = receiver.spans()
        applied = {s.attributes["antdt.rank"] for s in _of(spans, "apply plan", **ids)}
        effect = _of(spans, "effect", **ids)
        return spans if applied == set(range(WORLD)) and effect else None

    await asyncio.to_thread(telemetry.flush)  # the services' batch of spans
    spans = await wait_for(complete, timeout=20, what="apply spans of every rank and effect")

    # the root: the monitor's first transition of the incident
    incident = {"antdt.incident.id": action.incident_id}
    (root,) = _of(spans, "incident opened", **incident)
    assert root.scope == "antdt.monitor" and root.parent_id == ""
    assert root.attributes["antdt.job"] == run.job
    assert root.attributes["messaging.system"] == "nats"
    assert root.attributes["messaging.destination.name"].endswith(f"{run.job}.incident")
    trace = [s for s in spans if s.trace_id == root.trace_id]
    by_id = {s.span_id: s for s in trace}
    incident_spans = [s for s in trace if s.scope == "antdt.monitor"]
    assert all(s.attributes["antdt.incident.id"] == action.incident_id for s in incident_spans)
    assert all(s.parent_id in ("", root.span_id) for s in incident_spans)

    # the decision, a child of one of the incident's transitions
    (decide,) = _of(trace, "decide lb-bsp", **ids)
    assert decide.scope == "antdt.controller"
    assert by_id[decide.parent_id].scope == "antdt.monitor"
    assert decide.attributes["antdt.action.result"] == "applied"
    assert decide.attributes["antdt.plan.version"] == action.plan_version

    # per rank: send (child of decide) -> process on the rank (child of send) -> apply
    # (child of process, at the plan's effective step); ack (child of send)
    for rank in range(WORLD):
        sends = [s for s in _of(trace, "send adjust_batch", **ids) if s.parent_id == decide.span_id]
        mine = [s for s in sends if s.attributes["antdt.rank"] == rank]
        assert mine, f"no command span for rank {rank}"
        assert mine[0].attributes["messaging.destination.name"].endswith(f"cmd.{rank}")
        send_ids = {s.span_id for s in mine}
        processed = [
            s
            for s in _of(trace, "process adjust_batch", **ids)
            if s.attributes["antdt.rank"] == rank and s.parent_id in send_ids
        ]
        assert processed and processed[0].service == "antdt-agent", rank
        assert processed[0].resource["antdt.rank"] == rank
        (applied,) = [
            s for s in _of(trace, "apply plan", **ids) if s.attributes["antdt.rank"] == rank
        ]
        assert applied.parent_id in {p.span_id for p in processed}
        assert applied.attributes["antdt.step"] == action.effective_step
        assert applied.attributes["antdt.plan.applied_step"] == action.effective_step
        acks = [s for s in _of(trace, "ack", **ids) if s.parent_id in send_ids]
        assert acks and acks[0].attributes["antdt.ack.ok"] is True

    # the effect, measured after the switch, in the same trace under the decision
    (effect,) = _of(trace, "effect", **ids)
    assert effect.parent_id == decide.span_id
    assert effect.attributes["antdt.effect.step.after"] >= action.effective_step
    assert effect.attributes["antdt.effect.samples_per_s.after"] > 0
    assert "antdt.effect.samples_per_s.before" in effect.attributes

    # one trace: nothing of this action was traced anywhere else
    elsewhere = [
        s
        for s in spans
        if s.trace_id != root.trace_id and s.attributes.get("antdt.action.id") == action.action_id
    ]
    assert not elsewhere, elsewhere


async def test_metrics_of_the_run_reach_the_receiver(
    straggler_run: StragglerRun, telemetry: Telemetry
) -> None:
    run, receiver = straggler_run, telemetry.receiver
    await asyncio.to_thread(telemetry.flush)

    def job_points(metric: str) -> list[tuple[dict[str, Any], float]]:
        return [p for p in receiver.points(metric) if p[0].get("antdt.job") == run.job]

    incidents = job_points("antdt.incidents")
    assert any(a["antdt.incident.kind"] == "slow" and v >= 1 for a, v in incidents), incidents
    applied = [v for a, v in job_points("antdt.actions") if a["antdt.action.result"] == "applied"]
    assert applied and max(applied) >= 1
    latency = job_points("antdt.plan.latency")  # histogram sums, seconds
    assert latency and all(0 < v < 60 for _, v in latency)
    efficiency = job_points("antdt.job.balance_efficiency")
    assert efficiency and all(0 <= v <= 1 for _, v in efficiency)
    replica = run.settings.replica_id
    ingested = [
        v
        for a, v in receiver.points("antdt.monitor.events.ingested")
        if a["antdt.replica"] == replica
    ]
    assert ingested and max(ingested) >= sum(len(e) for e in run.steps.values()) * 0.9
