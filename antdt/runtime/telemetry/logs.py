"""structlog setup: JSON when not on a terminal, console otherwise. Every line carries the
fields bound for the process (`bind_process`: a rank's job and rank) and for the task
(`bind`, contextvars), and, inside a span, its trace and span ids and the job, rank,
incident and action ids among its attributes."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
from opentelemetry import trace

# Span attributes that become log fields: a line logged inside an incident's span says
# which job, rank, incident and action it is about without each call site binding them.
_SPAN_FIELDS = (
    ("antdt.job", "job"),
    ("antdt.rank", "rank"),
    ("antdt.incident.id", "incident"),
    ("antdt.action.id", "action"),
)
_process_fields: dict[str, Any] = {}


def add_trace_ids(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Processor: the current span's trace and span ids, and the job, rank, incident and
    action ids found on it (fields already on the line win)."""
    span = trace.get_current_span()
    ctx = span.get_span_context()
    if ctx.is_valid:
        event.setdefault("trace_id", format(ctx.trace_id, "032x"))
        event.setdefault("span_id", format(ctx.span_id, "016x"))
        attributes = getattr(span, "attributes", None)  # SDK spans; {} when not recording
        if attributes:
            for key, name in _SPAN_FIELDS:
                if key in attributes:
                    event.setdefault(name, attributes[key])
    return event


def add_process_fields(
    _: Any, __: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Processor: fields bound for the whole process (`bind_process`), every thread."""
    for key, value in _process_fields.items():
        event.setdefault(key, value)
    return event


def bind_process(**fields: Any) -> None:
    """Bind fields on every line of this process, from any thread (contextvars bound in
    one thread do not reach another: a training rank binds job and rank here)."""
    _process_fields.update(fields)


def configure_logging(level: str = "info", fmt: str = "auto", *, stream: Any = None) -> None:
    stream = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_process_fields,
            add_trace_ids,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
        ),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )


bind = structlog.contextvars.bind_contextvars
