"""One trace per straggler incident, across processes (its spans: docs/observability.md).
Each service adds a line or two at its hook points; the span logic is here. Context
crosses processes as W3C `traceparent` in NATS headers. Spans use the global tracer
provider unless one is passed; without one they cost nothing."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    StatusCode,
    TracerProvider,
)

from antdt.runtime.recent import Recent
from antdt.runtime.telemetry import metrics
from antdt.runtime.telemetry.brief import LISTED_RANKS, brief_batches
from antdt.schemas import Ack, ActionRecord, ActionResult, Incident, IncidentState, JobHealth

#: Jobs whose applied actions' effects are awaited, at most (each holds up to 16, with
#: the health before each: a large job's is big).
MAX_JOBS = 4096

JOB, RANK, INCIDENT, ACTION = "antdt.job", "antdt.rank", "antdt.incident.id", "antdt.action.id"


def messaging(subject: str, operation: str, message_id: str | None = None) -> dict[str, Any]:
    """Messaging semantic-convention attributes of a NATS operation: `publish` and
    `request` send, `process` handles a delivered message."""
    attributes: dict[str, Any] = {
        "messaging.system": "nats",
        "messaging.destination.name": subject,
        "messaging.operation.name": operation,
        "messaging.operation.type": "process" if operation == "process" else "send",
    }
    if message_id:
        attributes["messaging.message.id"] = message_id
    return attributes


def ns(seconds: float) -> int:
    return int(seconds * 1e9)


def under(span_context: SpanContext | None) -> otel_context.Context:
    """A context whose parent is `span_context`; an empty one (a new trace) without it."""
    if span_context is None or not span_context.is_valid:
        return otel_context.Context()
    return trace.set_span_in_context(NonRecordingSpan(span_context))


def _current() -> SpanContext | None:
    ctx = trace.get_current_span().get_span_context()
    return ctx if ctx.is_valid else None


# -- monitor -------------------------------------------------------------------------------


class IncidentTraces:
    """The monitor's side: the first transition of an incident starts its trace; later
    ones (escalated, resolved) are children of that root. A replica that
    takes a job over mid-incident carries its trace on (`adopt`)."""

    def __init__(self, limit: int = 100_000, *, provider: TracerProvider | None = None) -> None:
        self._tracer = (provider or trace.get_tracer_provider()).get_tracer("antdt.monitor")
        self._roots: Recent[SpanContext] = Recent(limit)

    def adopt(self, incident_id: str, root: SpanContext | None) -> None:
        """An incident another replica opened: its later transitions here are children
        of `root` (the span it was published under; None: they start a new trace)."""
        if root is not None and root.is_valid:
            self._roots.put(incident_id, root)

    @contextmanager
    def transition(self, incident: Incident, subject: str, msg_id: str) -> Iterator[Span]:
        """Current while the incident is published, so its headers carry the trace."""
        root = self._roots.get(incident.id)
        with self._tracer.start_as_current_span(
            f"incident {incident.state.value}",
            context=under(root),
            kind=SpanKind.PRODUCER,
            attributes={
                JOB: incident.job,
                RANK: incident.rank,
                INCIDENT: incident.id,
                "antdt.incident.kind": incident.kind.value,
                "antdt.incident.class": incident.straggler_class.value,
                "antdt.incident.cause": incident.cause.value,
                "antdt.incident.state": incident.state.value,
                "antdt.incident.ratio": incident.ratio,
                "antdt.incident.windows": incident.windows,
                "antdt.step": incident.step,
                **messaging(subject, "publish", msg_id),
            },
        ) as span:
            if root is None and span.get_span_context().is_valid:
                self._roots.put(incident.id, span.get_span_context())
            yield span
        if incident.state is IncidentState.RESOLVED:
            self._roots.pop(incident.id)
        metrics.incident(incident)


# -- controller ----------------------------------------------------------------------------


@dataclass
class _Effect:
    parent: SpanContext
    action_id: str
    incident_id: str | None
    plan_version: int
    measure_at: int  # first health step that counts as "after"
    since: float
    before: JobHealth | None


class Decision:
    """One `_decide` call: a span per action; for an incident that brought no action a
    `decide` span saying so."""

    def __init__(self, traces: DecisionTraces, job: str, policy: str, event: Any) -> None:
        self._traces, self.job, self.policy, self.event = traces, job, policy, event
        self.started = time.time_ns()
        self.acted = False

    @contextmanager
    def action(self, action: Any) -> Iterator[Span]:
        """Current while the executor carries `action` out (commands and the record)."""
        self.acted = True
        incident_id = getattr(action, "incident_id", None)
        attributes = {JOB: self.job, ACTION: action.action_id, "antdt.policy": self.policy}
        if incident_id:
            attributes[INCIDENT] = incident_id
        with self._traces.tracer.start_as_current_span(
            f"decide {self.policy}",
            context=self._traces.parent_for(incident_id, self.event),
            start_time=self.started,
            attributes={**attributes, "antdt.trigger": _trigger(self.event)},
        ) as span:
            yield span

    def done(self, record: ActionRecord, before: JobHealth | None) -> None:
        """The executor's record of the action (call inside `action`)."""
        span = trace.get_current_span()
        span.set_attributes(
            {
                "antdt.action.kind": record.kind,
                "antdt.action.result": record.result.value,
                "antdt.plan.version": record.plan_version or 0,
                "antdt.plan.effective_step": record.effective_step or 0,
                **_plan_attributes(record),
            }
        )
        if record.result in (ActionResult.FAILED, ActionResult.PARTIAL):
            span.set_status(StatusCode.ERROR, record.error or record.result.value)
        metrics.action(record)
        parent = span.get_span_context()
        applied = record.result in (ActionResult.APPLIED, ActionResult.PARTIAL)
        if applied and record.plan_version is not None and parent.is_valid:
            self._traces.expect_effect(record, parent, before)

    def close(self) -> None:
        if self.acted or not isinstance(self.event, Incident):
            return
        span = self._traces.tracer.start_span(
            f"decide {self.policy}",
            start_time=self.started,
            attributes={
                JOB: self.job,
                INCIDENT: self.event.id,
                "antdt.action.kind": "none",
                "antdt.trigger": "incident",
            },
        )
        span.end()


def _plan_attributes(record: ActionRecord) -> dict[str, Any]:
    """The plan's batches and the ranks that acked, listed up to LISTED_RANKS ranks; past
    that, the batches summed up (`brief_batches`) and the acks counted, with the ranks
    that did not ack (the record's `missing_ranks`) listed up to LISTED_RANKS."""
    batches, acked = record.local_batch or (), record.acked_ranks
    if len(batches) <= LISTED_RANKS and len(acked) <= LISTED_RANKS:
        return {"antdt.plan.local_batch": list(batches), "antdt.action.acked_ranks": list(acked)}
    summary = brief_batches(batches)
    if isinstance(summary, dict):
        attributes = {f"antdt.plan.local_batch.{k}": v for k, v in summary.items()}
    else:
        attributes = {"antdt.plan.local_batch": list(batches)}
    attributes["antdt.action.acked_count"] = len(acked)
    attributes["antdt.action.unacked_ranks"] = list(record.missing_ranks[:LISTED_RANKS])
    return attributes


def _trigger(event: Any) -> str:
    return "incident" if isinstance(event, Incident) else "health"


class DecisionTraces:
    """The controller's side: decisions join the trace of the incident they answer (the
    delivered incident, or one remembered from its delivery when a periodic health led
    to the action); each applied action's effect is measured `effect_steps` after its
    effective step, on the first JobHealth that far."""

    def __init__(
        self,
        *,
        effect_steps: int = 16,
        limit: int = 10_000,
        provider: TracerProvider | None = None,
    ) -> None:
        self.tracer = (provider or trace.get_tracer_provider()).get_tracer("antdt.controller")
        self.effect_steps = effect_steps
        self._incidents: Recent[SpanContext] = Recent(limit)
        # job -> applied actions not measured (a job that ends or moves first is forgotten)
        self._effects: Recent[list[_Effect]] = Recent(MAX_JOBS)

    def incident(self, incident: Incident) -> None:
        """In the incident's handler: remember its trace (the delivered context)."""
        current = _current()
        if current is not None:
            self._incidents.put(incident.id, current)

    def parent_for(self, incident_id: str | None, event: Any) -> otel_context.Context:
        if isinstance(event, Incident) and event.id == incident_id:
            return otel_context.get_current()
        remembered = self._incidents.get(incident_id) if incident_id else None
        return under(remembered) if remembered else otel_context.get_current()

    @contextmanager
    def decide(self, job: str, policy: str, event: Any) -> Iterator[Decision]:
        decision = Decision(self, job, policy, event)
        yield decision
        decision.close()

    def expect_effect(self, record: ActionRecord, parent: SpanContext, before: Any) -> None:
        pending = self._effects.get(record.job)
        if pending is None:
            pending = []
            self._effects.put(record.job, pending)
        del pending[: max(0, len(pending) - 15)]  # bounded: a job acting without health
        pending.append(
            _Effect(
                parent=parent,
                action_id=record.action_id,
                incident_id=record.incident_id,
                plan_version=record.plan_version or 0,
                measure_at=(record.effective_step or 0) + self.effect_steps,
                since=record.completed_at,
                before=before,
            )
        )

    def health(self, health: JobHealth) -> None:
        """Every JobHealth of an owned job: gauges, and the effect of applied actions."""
        metrics.job_health(health)
        pending = self._effects.get(health.job)
        if not pending:
            return
        due = [e for e in pending if health.step >= e.measure_at]
        for effect in due:
            pending.remove(effect)
            self._effect(effect, health)
        if not pending:
            self._effects.pop(health.job)

    def _effect(self, effect: _Effect, health: JobHealth) -> None:
        attributes: dict[str, Any] = {
            JOB: health.job,
            ACTION: effect.action_id,
            "antdt.step": health.step,
            "antdt.plan.version": effect.plan_version,
            "antdt.effect.plan_version": health.plan_version,  # newer: superseded since
        }
        if effect.incident_id:
            attributes[INCIDENT] = effect.incident_id
        attributes.update(_figures(health, "after"))
        if effect.before is not None:
            attributes.update(_figures(effect.before, "before"))
            if effect.before.samples_per_s > 0:
                speedup = health.samples_per_s / effect.before.samples_per_s
                attributes["antdt.effect.speedup"] = speedup
        span = self.tracer.start_span(
            "effect",
            context=under(effect.parent),
            start_time=ns(effect.since),
            attributes=attributes,
        )
        span.end(end_time=ns(max(health.at, effect.since)))


def _figures(health: JobHealth, when: str) -> dict[str, Any]:
    return {
        f"antdt.effect.samples_per_s.{when}": health.samples_per_s,
        f"antdt.effect.step_s.{when}": health.step_s,
        f"antdt.effect.balance_efficiency.{when}": health.balance_efficiency,
        f"antdt.effect.step.{when}": health.step,
    }


class CommandSend:
    """Yielded by `send`: call it with the ack (an `ack` child span); a send that ends
    without one is marked as an error."""

    def __init__(self, tracer: trace.Tracer, rank: int) -> None:
        self._tracer, self._rank = tracer, rank
        self.acked = False

    def __call__(self, ack: Ack) -> None:
        self.acked = True
        attributes: dict[str, Any] = {
            JOB: ack.job,
            RANK: ack.rank,
            ACTION: ack.action_id,
            "antdt.ack.ok": ack.ok,
            "antdt.ack.expected_rank": self._rank,
        }
        if ack.applied_step is not None:
            attributes["antdt.plan.applied_step"] = ack.applied_step
        if ack.plan_version is not None:
            attributes["antdt.plan.version"] = ack.plan_version
        with self._tracer.start_as_current_span("ack", attributes=attributes) as span:
            if not ack.ok:
                span.set_status(StatusCode.ERROR, ack.error or "refused")


@contextmanager
def send(subject: str, command: Any, rank: int) -> Iterator[CommandSend]:
    """Executor: one command attempt to one rank, current while the request is out, so
    the command's headers make the agent's span its child."""
    with _command_span(f"send {command.kind}", subject, command, "request", rank) as span:
        sent = CommandSend(trace.get_tracer("antdt.controller"), rank)
        yield sent
        if not sent.acked:
            span.set_status(StatusCode.ERROR, "no ack")


@contextmanager
def broadcast(subject: str, command: Any) -> Iterator[Callable[[int, int], None]]:
    """Executor: one command published to every rank of a job, current while the replies
    are gathered (each agent's span its child); call it with the ranks that acked and
    those that did not answer (an error unless every rank answered)."""
    with _command_span(f"broadcast {command.kind}", subject, command, "publish") as span:

        def acked(ranks: int, silent: int) -> None:
            span.set_attribute("antdt.acks", ranks)
            if silent:
                span.set_status(StatusCode.ERROR, f"{silent} ranks did not answer")

        yield acked


@contextmanager
def _command_span(
    name: str, subject: str, command: Any, operation: str, rank: int | None = None
) -> Iterator[Span]:
    """The producer span of a command sent (to `rank`, or to every rank), current."""
    tracer = trace.get_tracer("antdt.controller")
    attributes = {JOB: command.job, ACTION: command.action_id}
    if rank is not None:
        attributes[RANK] = rank
    if getattr(command, "incident_id", None):
        attributes[INCIDENT] = command.incident_id
    with tracer.start_as_current_span(
        name, kind=SpanKind.PRODUCER, attributes={**attributes, **messaging(subject, operation)}
    ) as span:
        yield span


__all__ = [
    "ACTION",
    "INCIDENT",
    "JOB",
    "RANK",
    "CommandSend",
    "Decision",
    "DecisionTraces",
    "IncidentTraces",
    "messaging",
    "send",
]
