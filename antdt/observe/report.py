"""`antdt report`: the thin I/O shell. Reads one job's recorded step events, health,
incidents and actions from JetStream, builds the Timeline (pure) and writes the picture
as PNG and as a self-contained HTML file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from antdt.observe.html import render_html
from antdt.observe.recorder import HEALTH_STREAM, STEP_STREAM
from antdt.observe.timeline import HealthPoint, RunRecord, Timeline, build_timeline
from antdt.runtime.bus import Bus, StreamMissing
from antdt.runtime.config import NatsSettings
from antdt.schemas import (
    ACTION_STREAM,
    INCIDENT_STREAM,
    ActionRecord,
    Incident,
    StepEvent,
    Subjects,
)

DEFAULT_LIMIT = 200_000  # messages per source (~0.3 GB decoded); a longer run is cut, and says so
ProgressFn = Callable[[str, int, int], None]


class ReportEmpty(RuntimeError):
    """Nothing was recorded for the job."""


@dataclass(frozen=True)
class ReportFiles:
    png: Path
    html: Path
    timeline: Timeline


def _sources(subjects: Subjects, job: str) -> list[tuple[str, str, str, Any]]:
    """(field of RunRecord, stream, subject filter, message type)."""
    return [
        ("steps", STEP_STREAM, subjects.step(job, "*"), StepEvent),
        ("health", HEALTH_STREAM, subjects.health(job), HealthPoint),
        ("incidents", INCIDENT_STREAM, subjects.incident(job), Incident),
        ("actions", ACTION_STREAM, subjects.action(job), ActionRecord),
    ]


async def fetch_run(
    bus: Bus,
    subjects: Subjects,
    job: str,
    *,
    limit: int = DEFAULT_LIMIT,
    on_progress: ProgressFn | None = None,
) -> RunRecord:
    """Everything recorded for `job`, with a note for each source missing or cut short."""
    record = RunRecord(job=job)
    for name, stream, subject, target in _sources(subjects, job):

        def progress(read: int, total: int, name: str = name) -> None:
            if on_progress is not None:
                on_progress(name, read, total)

        try:
            replay = await bus.jetstream.read(
                stream, subject, target, limit=limit, on_progress=progress
            )
        except StreamMissing:
            record.notes.append(f"stream {stream} does not exist: no {name} were recorded")
            continue
        getattr(record, name).extend(replay.items)
        if replay.truncated:
            record.notes.append(
                f"{name}: read {len(replay.items)} of {replay.available} recorded messages"
            )
        if replay.rejected:
            record.notes.append(f"{name}: skipped {replay.rejected} invalid messages")
    return record


def write_report(record: RunRecord, out_dir: Path) -> ReportFiles:
    """Draw the run and write `{job}.png` and `{job}.html` into `out_dir`."""
    from antdt.observe.figure import draw, png_bytes, svg_text  # matplotlib: extra `report`

    if not (record.steps or record.health or record.incidents or record.actions):
        notes = "; ".join(record.notes) or "the streams hold nothing for it"
        raise ReportEmpty(f"nothing recorded for job {record.job!r} ({notes})")
    timeline = build_timeline(record)
    fig = draw(timeline)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / f"{record.job}.png"
    html = out_dir / f"{record.job}.html"
    png.write_bytes(png_bytes(fig))
    html.write_text(render_html(timeline, svg_text(fig), png_name=png.name), encoding="utf-8")
    return ReportFiles(png=png, html=html, timeline=timeline)


async def report_job(
    nats: NatsSettings,
    job: str,
    out_dir: Path,
    *,
    console: Console | None = None,
    limit: int = DEFAULT_LIMIT,
) -> ReportFiles:
    """Connect, read with a progress bar, write the report."""
    console = console or Console(stderr=True)
    bus = await Bus(nats, name=f"antdt-report-{job}").connect(retry_for_s=10)
    columns = (TextColumn("reading {task.description}"), BarColumn(), MofNCompleteColumn())
    try:
        with Progress(*columns, console=console, transient=True) as bar:
            tasks: dict[str, Any] = {}

            def on_progress(name: str, read: int, total: int) -> None:
                if name not in tasks:
                    tasks[name] = bar.add_task(name, total=total)
                bar.update(tasks[name], completed=read, total=total)

            record = await fetch_run(
                bus, Subjects(nats.subject_prefix), job, limit=limit, on_progress=on_progress
            )
    finally:
        await bus.close()
    return write_report(record, out_dir)
