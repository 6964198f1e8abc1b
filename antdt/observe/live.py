"""`antdt status`, the I/O shell: fill a StatusState from what JetStream holds (incidents,
actions, the last recorded JobHealth) and the controller's current plan, then follow the
live subjects and redraw with rich.live until Ctrl-C (or print one frame: `--once`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TypeVar

from rich.console import Console
from rich.live import Live

from antdt.observe.recorder import HEALTH_STREAM
from antdt.observe.status import StatusState, render
from antdt.runtime.bus import Bus, BusError, Delivery, StreamMissing
from antdt.runtime.config import NatsSettings
from antdt.runtime.coordination.leftopen import LOOKBACKS_S
from antdt.schemas import (
    ACTION_STREAM,
    INCIDENT_STREAM,
    ActionRecord,
    Incident,
    JobHealth,
    Plan,
    PlanRequest,
    Subjects,
)

M = TypeVar("M")
HISTORY_LIMIT = 20_000  # incidents / actions replayed per job


async def load_state(
    bus: Bus, subjects: Subjects, job: str, *, recent: int = 8, state: StatusState | None = None
) -> StatusState:
    """What is known right now: replayed incidents and actions, the last recorded health,
    the current plan, into `state` (a new one if None: one already following the live
    subjects keeps what came meanwhile, each `apply_` keeping the newer). Sources that
    are missing become notes, not errors."""
    state = state if state is not None else StatusState(job=job, recent=recent)
    for incident in await _history(bus, state, INCIDENT_STREAM, subjects.incident(job), Incident):
        state.apply_incident(incident)
    for action in await _history(bus, state, ACTION_STREAM, subjects.action(job), ActionRecord):
        state.apply_action(action)
    with contextlib.suppress(StreamMissing):
        health = await bus.jetstream.last(HEALTH_STREAM, subjects.health(job), JobHealth)
        if health is not None:
            state.apply_health(health)
    await refresh_plan(bus, subjects, state)
    return state


async def _history(
    bus: Bus, state: StatusState, stream: str, subject: str, target: type[M]
) -> list[M]:
    """The job's messages on `stream`, oldest first: all of them while they are at most
    HISTORY_LIMIT, else those from a later start (LOOKBACKS_S), said in a note, as is a
    read still cut short (its newest messages, those that resolve, are then missing)."""
    try:
        replay, lookback = await bus.jetstream.read_recent(
            stream,
            subject,
            target,
            limit=HISTORY_LIMIT,
            lookbacks_s=LOOKBACKS_S,
            now=time.time(),
        )
    except StreamMissing:
        state.notes.append(f"stream {stream} does not exist yet")
        return []
    if lookback is not None:
        state.notes.append(f"{stream}: only its last {lookback / 3600:g} h read (too many)")
    if replay.truncated:
        held = replay.available
        state.notes.append(f"{stream}: read {len(replay.items)} of {held}: the newest are missing")
    return replay.items


async def refresh_plan(bus: Bus, subjects: Subjects, state: StatusState) -> None:
    try:
        plan = await bus.request(
            subjects.plan_get(state.job), PlanRequest(job=state.job, rank=0), Plan, timeout=2.0
        )
    except BusError as exc:
        if not any(n.startswith("plan unavailable") for n in state.notes):
            state.notes.append(f"plan unavailable: {exc}")
        return
    state.notes = [n for n in state.notes if not n.startswith("plan unavailable")]
    state.apply_plan(plan)


async def follow(bus: Bus, subjects: Subjects, state: StatusState) -> asyncio.Event:
    """Subscribe to the job's live subjects; the returned event is set on every change."""
    changed = asyncio.Event()

    async def on_health(health: JobHealth, _: Delivery) -> None:
        state.apply_health(health)
        changed.set()

    async def on_incident(incident: Incident, _: Delivery) -> None:
        state.apply_incident(incident)
        changed.set()

    async def on_action(action: ActionRecord, _: Delivery) -> None:
        state.apply_action(action)
        await refresh_plan(bus, subjects, state)
        changed.set()

    job = state.job
    await bus.subscribe(subjects.health(job), JobHealth, on_health)
    await bus.subscribe(subjects.incident(job), Incident, on_incident)
    await bus.subscribe(subjects.action(job), ActionRecord, on_action)
    return changed


async def run_status(
    nats: NatsSettings,
    job: str,
    *,
    once: bool = False,
    refresh_s: float = 1.0,
    plan_every_s: float = 5.0,
    console: Console | None = None,
) -> StatusState:
    console = console or Console()
    subjects = Subjects(nats.subject_prefix)
    bus = await Bus(nats, name=f"antdt-status-{job}").connect(retry_for_s=10)
    try:
        state = StatusState(job=job)
        changed = await follow(bus, subjects, state)  # first: nothing sent meanwhile is missed
        await load_state(bus, subjects, job, state=state)
        if once:
            await _first_health(state, changed, 3 * refresh_s + 1)
            console.print(render(state, time.time()))
            return state
        await _live(bus, subjects, state, changed, console, refresh_s, plan_every_s)
        return state
    finally:
        await bus.close()


async def _first_health(state: StatusState, changed: asyncio.Event, wait_s: float) -> None:
    """Nothing recorded: wait up to `wait_s` for one live JobHealth (1 Hz); an incident or
    an action heard meanwhile is not one."""
    deadline = time.monotonic() + wait_s
    while state.health is None and (left := deadline - time.monotonic()) > 0:
        changed.clear()
        with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout=left)


async def _live(
    bus: Bus,
    subjects: Subjects,
    state: StatusState,
    changed: asyncio.Event,
    console: Console,
    refresh_s: float,
    plan_every_s: float,
) -> None:
    last_plan = time.monotonic()
    with Live(render(state, time.time()), console=console, auto_refresh=False) as live:
        while True:
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=refresh_s)
            changed.clear()
            if time.monotonic() - last_plan >= plan_every_s:
                await refresh_plan(bus, subjects, state)
                last_plan = time.monotonic()
            live.update(render(state, time.time()), refresh=True)
