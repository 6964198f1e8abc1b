"""Follows one job on the bus while the demo trains: health, incidents, actions."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import NatsSettings
from antdt.schemas import ActionRecord, Incident, JobHealth, Subjects


class JobWatcher:
    def __init__(self, nats: str | NatsSettings, job: str, *, incidents: bool = True) -> None:
        """`nats`: a URL (no auth), or the settings of a user who may read the job (an
        observer may read all but its incidents: `incidents=False`)."""
        self.settings = NatsSettings(url=nats) if isinstance(nats, str) else nats
        self.follow_incidents = incidents
        self.job = job
        self.health: list[JobHealth] = []
        self.incidents: list[Incident] = []
        self.actions: list[ActionRecord] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._bus: Bus | None = None

    def start(self) -> JobWatcher:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._subscribe(), self._loop).result(timeout=30)
        return self

    async def _subscribe(self) -> None:
        self._bus = await Bus(self.settings, name=f"demo-watch-{self.job}").connect()
        subjects = Subjects(self.settings.subject_prefix)

        async def on_health(health: JobHealth, _: Delivery) -> None:
            self.health.append(health)

        async def on_incident(incident: Incident, _: Delivery) -> None:
            self.incidents.append(incident)

        async def on_action(action: ActionRecord, _: Delivery) -> None:
            self.actions.append(action)

        await self._bus.subscribe(subjects.health(self.job), JobHealth, on_health)
        if self.follow_incidents:
            await self._bus.subscribe(subjects.incident(self.job), Incident, on_incident)
        await self._bus.subscribe(subjects.action(self.job), ActionRecord, on_action)
        await self._bus.flush()

    def summary_line(self) -> str:
        parts = []
        if self.health:
            last = self.health[-1]
            parts.append(f"step {last.step}  efficiency {last.balance_efficiency:.2f}")
        if self.incidents:
            last_incident = self.incidents[-1]
            parts.append(
                f"incident r{last_incident.rank} {last_incident.kind.value} "
                f"{last_incident.state.value} x{last_incident.ratio:.1f}"
            )
        if self.actions:
            batch = self.actions[-1].local_batch
            parts.append(f"{len(self.actions)} action(s), plan {list(batch or ())}")
        return "  ".join(parts)

    def stop(self) -> None:
        async def close() -> None:
            if self._bus is not None:
                await self._bus.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
