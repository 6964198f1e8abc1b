"""Observability for people: `recorder` (the streams a run is drawn from afterwards),
`timeline` (pure) -> `figure` and `html` -> `report` (`antdt report`), `status` (pure) ->
`live` (`antdt status`). Reads only the wire contract and the runtime, never a service;
matplotlib is imported only when a report is written."""

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
