"""Observability for people: recording streams, `antdt status` and `antdt report`.

- `recorder`: bounded JetStream streams ANTDT_STEPS and ANTDT_HEALTH (ensured by whoever
  starts the services) so a run can be drawn after it ended.
- `timeline` (pure) -> `figure` (matplotlib, extra `report`) and `html` (pure) ->
  `report` (the I/O shell of `antdt report`).
- `status` (pure state and renderer) -> `live` (the I/O shell of `antdt status`).

Imports only the wire contract and the runtime (import-linter), never a service; matplotlib
is imported only when a report is written."""

from antdt.observe.live import load_state, run_status
from antdt.observe.recorder import (
    HEALTH_STREAM,
    STEP_STREAM,
    ensure_recording,
    ensure_recording_at,
    recording_streams,
)
from antdt.observe.report import ReportEmpty, ReportFiles, fetch_run, report_job, write_report
from antdt.observe.status import StatusState, render
from antdt.observe.timeline import RunRecord, Timeline, build_timeline

__all__ = [
    "HEALTH_STREAM",
    "STEP_STREAM",
    "ReportEmpty",
    "ReportFiles",
    "RunRecord",
    "StatusState",
    "Timeline",
    "build_timeline",
    "ensure_recording",
    "ensure_recording_at",
    "fetch_run",
    "load_state",
    "recording_streams",
    "render",
    "report_job",
    "run_status",
    "write_report",
]
