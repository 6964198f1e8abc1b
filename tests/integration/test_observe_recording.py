"""Recording and reading back a run on a real nats-server (JetStream): the recorder's
bounded streams, the bus's bounded reads, `antdt report` and `antdt status --once`."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from antdt.observe import (
    HEALTH_STREAM,
    STEP_STREAM,
    ensure_recording,
    fetch_run,
    load_state,
    run_status,
    write_report,
)
from antdt.observe.timeline import HealthPoint, RunRecord
from antdt.runtime.bus import Bus, StreamMissing
from antdt.runtime.config import RecordingSettings, ServiceSettings
from antdt.schemas import (
    ACTION_STREAM,
    INCIDENT_STREAM,
    JobHealth,
    RankColumns,
    StepEvent,
    Subjects,
)
from tests.helpers import wait_for
from tests.unit.test_observe_report import marker_columns, parse_report
from tests.unit.test_observe_timeline import JOB, synthetic_run

pytestmark = pytest.mark.integration

LIMITS = RecordingSettings(
    steps_max_age_s=3600,
    steps_max_bytes=8 * 1024 * 1024,
    health_max_age_s=600,
    health_max_bytes=1024 * 1024,
)


async def _record(bus: Bus, subjects: Subjects, run: RunRecord) -> None:
    """Publish a run the way the services do: steps and health on core NATS (the recorder
    streams capture them), incidents and actions to their JetStream streams."""
    await bus.jetstream.ensure_stream(INCIDENT_STREAM, [subjects.any_job("incident")])
    await bus.jetstream.ensure_stream(ACTION_STREAM, [subjects.any_job("action")])
    for event in run.steps:
        await bus.publish(subjects.step(event.job, event.rank), event)
    for health in run.health:
        await bus.publish(subjects.health(health.job), health)
    for incident in run.incidents:
        await bus.jetstream.publish(subjects.incident(incident.job), incident)
    for action in run.actions:  # msg ids de-duplicate per stream: unique across tests
        msg_id = f"{subjects.prefix}-{action.action_id}"
        await bus.jetstream.publish(subjects.action(action.job), action, msg_id=msg_id)
    await bus.flush()


async def _stored(bus: Bus, stream: str, subject: str) -> int:
    return (await bus.jetstream.read(stream, subject, StepEvent, limit=1)).available


async def test_recorder_streams_are_bounded_and_capture_core_publishes(
    bus: Bus, settings: ServiceSettings
) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    specs = await ensure_recording(bus, subjects, LIMITS)
    assert [s.name for s in specs] == [STEP_STREAM, HEALTH_STREAM]
    js = bus.nc.jetstream()
    steps_cfg = (await js.stream_info(STEP_STREAM)).config
    health_cfg = (await js.stream_info(HEALTH_STREAM)).config
    assert steps_cfg.subjects == [f"{settings.nats.subject_prefix}.*.step.*"]
    assert (steps_cfg.max_age, steps_cfg.max_bytes) == (3600, 8 * 1024 * 1024)
    assert health_cfg.subjects == [f"{settings.nats.subject_prefix}.*.health"]
    assert (health_cfg.max_age, health_cfg.max_bytes) == (600, 1024 * 1024)
    assert await ensure_recording(bus, subjects, LIMITS) == specs  # idempotent
    assert await ensure_recording(bus, subjects, RecordingSettings(enabled=False)) == []

    run = synthetic_run(steps=10)
    await _record(bus, subjects, run)
    step_filter = subjects.step(JOB, "*")
    await wait_for(lambda: _stored(bus, STEP_STREAM, step_filter), what="steps stored")
    await wait_for(
        lambda: _all_stored(bus, step_filter, len(run.steps)), what=f"{len(run.steps)} steps"
    )


async def _all_stored(bus: Bus, subject: str, n: int) -> bool:
    return await _stored(bus, STEP_STREAM, subject) >= n


async def test_fetch_run_reads_one_job_back_and_reports_it(
    bus: Bus, settings: ServiceSettings, tmp_path: Path
) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    await ensure_recording(bus, subjects, LIMITS)
    run = synthetic_run()
    other = RunRecord(job="other")
    other.steps = [e.model_copy(update={"job": "other"}) for e in synthetic_run(steps=5).steps]
    await _record(bus, subjects, other)
    await _record(bus, subjects, run)
    await wait_for(lambda: _all_stored(bus, subjects.step(JOB, "*"), len(run.steps)))

    progress: list[tuple[str, int, int]] = []
    back = await fetch_run(bus, subjects, JOB, on_progress=lambda *p: progress.append(p))
    assert back.notes == []
    assert sorted((e.step, e.rank) for e in back.steps) == sorted(
        (e.step, e.rank) for e in run.steps
    )
    read = [HealthPoint.model_validate_json(h.model_dump_json()) for h in run.health]
    assert back.health == read and back.incidents == run.incidents
    assert back.actions == run.actions
    assert ("steps", len(run.steps), len(run.steps)) in progress

    files = write_report(back, tmp_path)
    assert marker_columns(files.png)
    actions = parse_report(files.html).tables["actions"]
    assert {"id": "act-1", "class": "result-applied"} in actions


async def test_the_report_reads_the_health_of_a_large_job(
    bus: Bus, settings: ServiceSettings, unique: str
) -> None:
    """A JobHealth of 8,000 ranks is ~0.45 MB of JSON: the report takes it at JobHealth's
    own size limit (not the 256 KiB of other messages), keeping its figures, not rows."""
    subjects = Subjects(settings.nats.subject_prefix)
    await ensure_recording(bus, subjects, LIMITS)
    job = f"large{unique}"
    health = synthetic_run(steps=5).health[0]
    row = health.ranks[0]
    rows = tuple(row.model_copy(update={"rank": r, "host": f"h{r}"}) for r in range(8000))
    run_health = health.model_copy(
        update={"job": job, "ranks": RankColumns.of_rows(rows), "step": 7}
    )
    assert len(run_health.model_dump_json()) > 256 * 1024
    await bus.publish(subjects.health(job), run_health)
    await wait_for(lambda: _stored(bus, HEALTH_STREAM, subjects.health(job)), what="stored")
    back = await fetch_run(bus, subjects, job)
    assert [(h.step, h.ranks, h.balance_efficiency) for h in back.health] == [
        (7, 8000, run_health.balance_efficiency)
    ]
    assert not any("health" in note for note in back.notes), back.notes


async def test_bounded_reads_say_when_they_were_cut(bus: Bus, settings: ServiceSettings) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    await ensure_recording(bus, subjects, LIMITS)
    run = synthetic_run(steps=10)
    await _record(bus, subjects, run)
    await bus.publish_raw(subjects.step(JOB, 0), b'{"not": "a step event"}')
    await wait_for(lambda: _all_stored(bus, subjects.step(JOB, "*"), len(run.steps) + 1))

    replay = await bus.jetstream.read(STEP_STREAM, subjects.step(JOB, "*"), StepEvent, batch=7)
    assert (len(replay.items), replay.rejected, replay.truncated) == (40, 1, False)
    cut = await bus.jetstream.read(STEP_STREAM, subjects.step(JOB, "*"), StepEvent, limit=15)
    assert (len(cut.items), cut.available, cut.truncated) == (15, 41, True)
    record = await fetch_run(bus, subjects, JOB, limit=15)
    assert "steps: read 15 of 41 recorded messages" in record.notes


async def test_missing_streams_and_last_messages(bus: Bus, settings: ServiceSettings) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    with pytest.raises(StreamMissing):
        await bus.jetstream.read("ANTDT_NO_SUCH_STREAM", subjects.step(JOB, "*"), StepEvent)
    with pytest.raises(StreamMissing):
        await bus.jetstream.last("ANTDT_NO_SUCH_STREAM", subjects.health(JOB), JobHealth)
    await ensure_recording(bus, subjects, LIMITS)
    assert await bus.jetstream.last(HEALTH_STREAM, subjects.health("nobody"), JobHealth) is None
    run = synthetic_run(steps=20)
    await _record(bus, subjects, run)

    async def newest() -> JobHealth | None:
        return await bus.jetstream.last(HEALTH_STREAM, subjects.health(JOB), JobHealth)

    assert await wait_for(newest) == run.health[-1]
    state = await load_state(bus, subjects, JOB)  # no controller: the plan is a note
    assert state.health == run.health[-1] and set(state.actions) == {"act-0", "act-1"}
    assert any(n.startswith("plan unavailable") for n in state.notes)


async def test_cli_report_and_status_once(
    bus: Bus, settings: ServiceSettings, tmp_path: Path
) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    await ensure_recording(bus, subjects, LIMITS)
    run = synthetic_run()
    await _record(bus, subjects, run)
    await wait_for(lambda: _all_stored(bus, subjects.step(JOB, "*"), len(run.steps)))
    env = dict(os.environ, ANTDT_NATS__SUBJECT_PREFIX=settings.nats.subject_prefix)
    base = [sys.executable, "-m", "antdt.cli"]
    url = ["--nats-url", settings.nats.url]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [*base, *args, *url]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)

    done = await asyncio.to_thread(cli, "report", "--job", JOB, "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(tmp_path / f"{JOB}.png"), str(tmp_path / f"{JOB}.html")]
    missing = await asyncio.to_thread(cli, "report", "--job", "ghost", "--out", str(tmp_path))
    assert missing.returncode == 1 and "nothing recorded for job 'ghost'" in missing.stderr

    shown = await asyncio.to_thread(cli, "status", "--job", JOB, "--once")
    assert shown.returncode == 0, shown.stderr
    assert "act-1" in shown.stdout and "slow/persistent" not in shown.stdout  # no rank 3 health
    assert "job-a-r3-slow-1" in shown.stdout and "efficiency 0.90" in shown.stdout


async def test_live_status_follows_new_actions(bus: Bus, settings: ServiceSettings) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    await ensure_recording(bus, subjects, LIMITS)
    run = synthetic_run(steps=10)
    await _record(bus, subjects, run)
    # a terminal: without one rich.live draws only the last frame, when it stops
    console = Console(record=True, width=200, force_terminal=True, file=io.StringIO())
    task = asyncio.create_task(
        run_status(settings.nats, JOB, once=False, refresh_s=0.05, console=console)
    )

    def shown(needle: str) -> bool:
        return needle in console.export_text(clear=False)

    try:
        await wait_for(lambda: shown("act-1"), what="replayed action drawn")
        later = run.actions[0].model_copy(
            update={"action_id": "act-live", "decided_at": run.actions[0].decided_at + 60}
        )
        await bus.publish(subjects.action(JOB), later)  # live, like the controller
        await wait_for(lambda: shown("act-live"), what="live action drawn")
        health = run.health[-1].model_copy(update={"at": run.health[-1].at + 60, "step": 777})
        await bus.publish(subjects.health(JOB), health)
        await wait_for(lambda: shown("step 777"), what="live health drawn")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_status_says_when_it_could_not_read_a_jobs_whole_history(
    bus: Bus, settings: ServiceSettings, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More incident transitions than a status reads: the oldest read are not taken for
    the job's state silently (their resolutions may be among those not read)."""
    from antdt.observe import live

    subjects = Subjects(settings.nats.subject_prefix)
    job = f"many{unique}"
    await bus.jetstream.ensure_stream(INCIDENT_STREAM, [subjects.any_job("incident")])
    incident = synthetic_run(steps=5).incidents[0]
    for n in range(3):
        opened = incident.model_copy(update={"job": job, "id": f"{job}-r{n}", "rank": n})
        await bus.jetstream.publish(subjects.incident(job), opened, msg_id=f"{job}-{n}")
    monkeypatch.setattr(live, "HISTORY_LIMIT", 2)
    monkeypatch.setattr(live, "LOOKBACKS_S", (None, 3600.0))
    state = await load_state(bus, subjects, job)
    assert f"{INCIDENT_STREAM}: only its last 1 h read (too many)" in state.notes
    assert f"{INCIDENT_STREAM}: read 2 of 3: the newest are missing" in state.notes
