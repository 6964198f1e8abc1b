"""A monitor replica's step subscriptions (one per owned job) share one backlog budget,
against real nats-server and etcd: a replica far behind holds at most
`step_backlog_bytes` of step events, whatever the number of jobs it owns, and drops
(and counts) the rest. A cap per subscription alone let it hold that much per job."""

from __future__ import annotations

import asyncio

import pytest

from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import ServiceSettings
from antdt.runtime.coordination.ownership import Ownership
from antdt.runtime.store import Store
from antdt.schemas import StepEvent, Subjects
from antdt.services.monitor import intake as intake_module
from antdt.services.monitor.intake import JobIntake
from tests.helpers import wait_for
from tests.integration.test_monitor_ha import step

pytestmark = pytest.mark.integration

BUDGET = 30_000  # bytes: about 80 step events
EVENTS = 200  # per job: far past its share


async def test_a_replicas_step_backlog_is_one_budget_its_jobs_share(
    settings: ServiceSettings, bus: Bus, store: Store, unique: str
) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    release, handled = asyncio.Event(), [0]

    async def stuck(_: StepEvent, __: Delivery) -> None:  # a replica far behind
        await release.wait()
        handled[0] += 1

    ownership = Ownership.for_service(store, settings, "monitor")
    intake = JobIntake(bus, subjects, ownership, stuck, round_s=1.0, backlog_bytes=BUDGET)
    jobs = [f"bl{unique}-{n}" for n in range(3)]

    def dropped(*of: str) -> int:
        return sum(bus.rejections.total(subjects.step(job, "*")) for job in of or jobs)

    async def send(job: str, steps: range) -> None:
        for n in steps:
            await bus.publish(subjects.step(job, 0), step(0, n, job))
        await bus.flush()

    try:
        for job in jobs:
            assert await intake.claim(job)
        for job in jobs:
            await send(job, range(EVENTS))
        # Each event is in a handler (one per job), waiting, or dropped.
        await wait_for(
            lambda: len(jobs) + intake.backlog[0] + dropped() == EVENTS * len(jobs),
            what="every event accounted for",
        )
        waiting, waiting_bytes = intake.backlog
        event_bytes = waiting_bytes / waiting
        # Each job's share is full to within an event or two (a drop leaves room for a
        # smaller one), and nothing beyond it was kept.
        assert BUDGET - 2 * len(jobs) * event_bytes < waiting_bytes < BUDGET
        assert all(dropped(job) > 0 for job in jobs)

        # A job unwatched gives its share to the others: the first now holds up to half
        # the budget, a sixth more than its third did.
        intake.unwatch(jobs[2])
        before, base = dropped(jobs[0]), intake.backlog[1]
        await send(jobs[0], range(EVENTS, 2 * EVENTS))
        await wait_for(lambda: dropped(jobs[0]) > before, what="the first job full again")
        assert abs(intake.backlog[1] - base - BUDGET / 6) < 2 * event_bytes
    finally:
        release.set()
        for job in jobs:
            intake.unwatch(job)
        await ownership.stop()


async def test_a_dormant_job_holds_a_small_backlog_beside_the_owned_jobs_budget(
    settings: ServiceSettings, bus: Bus, store: Store, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every replica receives the steps of every dormant job (up to MAX_DORMANT): each
    holds DORMANT_BACKLOG_BYTES at most and takes no share of the budget, so the owned
    jobs keep it whole however many jobs are dormant."""
    monkeypatch.setattr(intake_module, "DORMANT_BACKLOG_BYTES", 10_000)
    subjects = Subjects(settings.nats.subject_prefix)
    release = asyncio.Event()

    async def stuck(_: StepEvent, __: Delivery) -> None:
        await release.wait()

    ownership = Ownership.for_service(store, settings, "monitor")
    intake = JobIntake(bus, subjects, ownership, stuck, round_s=1.0, backlog_bytes=BUDGET)
    owned, dormant = f"own{unique}", f"dormant{unique}"

    async def send(job: str) -> None:
        for n in range(EVENTS):
            await bus.publish(subjects.step(job, 0), step(0, n, job))
        await bus.flush()

    def dropped(job: str) -> int:
        return bus.rejections.total(subjects.step(job, "*"))

    try:
        assert await intake.claim(owned)
        await intake.keep_dormant(dormant)
        assert intake.dormant == [dormant] and intake.watched == sorted([owned, dormant])
        await send(dormant)
        await wait_for(
            lambda: 1 + intake.backlog[0] + dropped(dormant) == EVENTS,
            what="the dormant job's events accounted for",
        )
        waiting, dormant_bytes = intake.backlog
        assert 10_000 - 2 * dormant_bytes / waiting < dormant_bytes <= 10_000
        await send(owned)
        await wait_for(
            lambda: 2 + intake.backlog[0] + dropped(dormant) + dropped(owned) == 2 * EVENTS,
            what="every event accounted for",
        )
        # The owned job's share is the whole budget, not half of it.
        assert intake.backlog[1] - dormant_bytes > BUDGET - 2 * dormant_bytes / waiting
    finally:
        release.set()
        intake.wake(dormant)
        for job in (owned, dormant):
            intake.unwatch(job)
        await ownership.stop()


async def test_a_job_watched_twice_at_once_is_subscribed_once(
    settings: ServiceSettings, bus: Bus, store: Store, unique: str
) -> None:
    """Two callers watching one job at once (a claim round, a hello's claim) leave one
    subscription: each step is handled once."""
    subjects = Subjects(settings.nats.subject_prefix)
    handled: list[int] = []

    async def on_step(event: StepEvent, _: Delivery) -> None:
        handled.append(event.step)

    ownership = Ownership.for_service(store, settings, "monitor")
    intake = JobIntake(bus, subjects, ownership, on_step, round_s=1.0, backlog_bytes=BUDGET)
    job = f"twice{unique}"
    try:
        await asyncio.gather(intake.keep_dormant(job), intake.keep_dormant(job))
        assert intake.watched == [job]
        for n in (1, 2, 3):
            await bus.publish(subjects.step(job, 0), step(0, n, job))
        await bus.flush()
        await wait_for(lambda: len(handled) >= 3, what="the steps handled")
        await asyncio.sleep(0.3)  # a second subscription's deliveries would come too
        assert handled == [1, 2, 3]
    finally:
        intake.wake(job)
        intake.unwatch(job)
        await ownership.stop()
