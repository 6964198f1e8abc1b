"""Log lines carry the current trace: structlog's capture_logs with AntDT's processors,
and the JSON renderer configure_logging installs off a terminal."""

from __future__ import annotations

import io
import json

import structlog
from opentelemetry.sdk.trace import TracerProvider
from structlog.testing import capture_logs

from antdt.runtime.telemetry import logs
from antdt.runtime.telemetry.logs import add_process_fields, add_trace_ids, configure_logging

tracer = TracerProvider().get_tracer("test")


def test_lines_inside_a_span_carry_its_trace_and_ids() -> None:
    log = structlog.get_logger("t")
    with capture_logs(processors=[add_process_fields, add_trace_ids]) as lines:
        log.info("outside")
        with tracer.start_as_current_span(
            "incident opened",
            attributes={"antdt.job": "j", "antdt.rank": 3, "antdt.incident.id": "j-r3-slow-1"},
        ) as span:
            log.info("inside", rank=7)  # a field given on the line wins
        ctx = span.get_span_context()
    outside, inside = lines
    assert "trace_id" not in outside and "job" not in outside
    assert inside["trace_id"] == format(ctx.trace_id, "032x")
    assert inside["span_id"] == format(ctx.span_id, "016x")
    assert inside["job"] == "j" and inside["incident"] == "j-r3-slow-1" and inside["rank"] == 7


def test_json_off_a_terminal_with_process_fields_on_every_line() -> None:
    out = io.StringIO()  # not a tty: JSON
    saved = dict(logs._process_fields)
    try:
        configure_logging("info", "auto", stream=out)
        logs.bind_process(job="train-1", rank=2)
        log = structlog.get_logger("t")
        with tracer.start_as_current_span("apply plan") as span:
            log.info("plan applied", step=12)
        log.debug("filtered out")
    finally:
        logs._process_fields.clear()
        logs._process_fields.update(saved)
        structlog.reset_defaults()
    (line,) = [json.loads(x) for x in out.getvalue().splitlines()]
    assert line["event"] == "plan applied" and line["level"] == "info" and line["step"] == 12
    assert line["job"] == "train-1" and line["rank"] == 2
    assert line["trace_id"] == format(span.get_span_context().trace_id, "032x")
