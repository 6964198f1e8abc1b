"""The agent's spans of an incident's trace (`process adjust_batch`, a child of the
controller's send; `apply plan`, the first step under the plan), all made on the agent's
loop thread: the training thread never pays for them."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanContext, SpanKind, StatusCode, TracerProvider

from antdt.runtime.telemetry.tracing import ACTION, INCIDENT, JOB, RANK, messaging, ns, under


class AgentTraces:
    """One rank's spans. `provider` None: the global tracer provider."""

    def __init__(self, job: str, rank: int, provider: TracerProvider | None = None) -> None:
        self.job, self.rank = job, rank
        self._tracer = (provider or trace.get_tracer_provider()).get_tracer("antdt.agent")
        # plan version -> (the process span, the action, its incident, the applied step)
        self._pending: dict[int, tuple[SpanContext, str, str | None, int]] = {}

    def command(
        self, cmd: Any, subject: str, verdict: str, applied_step: int | None = None
    ) -> None:
        """A command judged (on the loop, inside its delivery). `verdict`: accept (the
        plan will apply at `applied_step`), same (already known), or a refusal code."""
        attributes: dict[str, Any] = {
            JOB: self.job,
            RANK: self.rank,
            ACTION: cmd.action_id,
            "antdt.command.verdict": verdict,
            **messaging(subject, "process"),
        }
        if cmd.incident_id:
            attributes[INCIDENT] = cmd.incident_id
        plan = getattr(cmd, "plan", None)
        if plan is not None:
            attributes["antdt.plan.version"] = plan.version
            attributes["antdt.plan.local_batch"] = plan.local_batch[self.rank]
        if applied_step is not None:
            attributes["antdt.plan.applied_step"] = applied_step
        span = self._tracer.start_span(
            f"process {cmd.kind}", kind=SpanKind.CONSUMER, attributes=attributes
        )
        if verdict not in ("accept", "same"):
            span.set_status(StatusCode.ERROR, verdict)
        span.end()
        ctx = span.get_span_context()
        if verdict == "accept" and plan is not None and applied_step is not None and ctx.is_valid:
            self._pending[plan.version] = (ctx, cmd.action_id, cmd.incident_id, applied_step)

    def stepped(self, records: list[Any]) -> None:
        """Step records reaching the loop: the first one run under a pending plan (or a
        newer one: the plan was superseded before its step) closes it."""
        if not self._pending:
            return
        for record in records:
            for version in [v for v in self._pending if v <= record.plan_version]:
                ctx, action_id, incident_id, applied_step = self._pending.pop(version)
                if version == record.plan_version:
                    self._apply(record, ctx, action_id, incident_id, applied_step)

    def _apply(
        self, record: Any, parent: SpanContext, action_id: str, incident: str | None, at: int
    ) -> None:
        attributes: dict[str, Any] = {
            JOB: self.job,
            RANK: self.rank,
            ACTION: action_id,
            "antdt.step": record.step,
            "antdt.plan.version": record.plan_version,
            "antdt.plan.applied_step": at,
            "antdt.plan.local_batch": record.local_batch,
            "antdt.step.samples": record.samples,
            "antdt.step.seconds": record.step_s,
        }
        if incident:
            attributes[INCIDENT] = incident
        span = self._tracer.start_span(
            "apply plan",
            context=under(parent),
            start_time=ns(record.started_at),
            attributes=attributes,
        )
        span.end(end_time=ns(record.started_at + record.step_s))
