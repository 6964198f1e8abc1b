"""A job whose ranks all went silent without exiting (its launcher gave up) is ended by
the monitor after `abandon_after_s`, and both services give it up; it stays dormant, and
its next step makes it live again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from typer.testing import CliRunner

from antdt.cli import app
from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.runtime.coordination.jobs import live_jobs
from antdt.runtime.store import StoreUnavailable
from antdt.schemas import (
    Incident,
    IncidentState,
    JobHealth,
    Keys,
    RankState,
    RegisterReply,
    Subjects,
)
from antdt.services.monitor import takeon
from antdt.services.monitor.lifecycle import JobPhase
from tests.e2e.conftest import start_services
from tests.helpers import monitor_owner, table_row, wait_for
from tests.integration.test_services import finished, spec, step

pytestmark = pytest.mark.integration


async def test_a_job_whose_ranks_went_silent_is_ended_and_given_up(
    bus: Bus, settings: ServiceSettings, unique: str
) -> None:
    running = await start_services(settings, ("monitor", "controller"), abandon_after_s=2.0)
    try:
        monitor, controller = running.by_name["monitor"], running.by_name["controller"]
        subjects, keys, store = (
            Subjects(settings.nats.subject_prefix),
            Keys(settings.etcd.key_prefix),
            monitor.store,
        )
        job = f"gone-{unique}"
        incidents: list[Incident] = []

        async def on_incident(incident: Incident, _: object) -> None:
            incidents.append(incident)

        await bus.subscribe(subjects.incident(job), Incident, on_incident)
        await bus.request(subjects.register(job), spec(job), RegisterReply)
        await monitor_owner(store, keys, job)
        for n in range(12):
            for rank in (0, 1):
                await bus.publish(subjects.step(job, rank), step(job, rank, n))
        await wait_for(lambda: job in monitor.detectors, what="the monitor watches the job")
        assert controller.ownership.owns(job)
        # Then nothing: no step, no exit, no hello.
        end = await wait_for(lambda: store.get(keys.ended(job)), timeout=15, what="the job ended")
        health = JobHealth.model_validate_json(end.value)
        assert {r.state for r in health.ranks} == {RankState.EXITED} and health.step == 11
        for service in ("monitor", "controller"):
            owner = keys.owner(service, job)
            await wait_for(lambda o=owner: _absent(store, o), what=f"the {service} gives it up")
        assert job not in await live_jobs(store, keys) and job not in monitor.detectors
        opened = {i.id for i in incidents if i.state is IncidentState.OPENED}
        resolved = {i.id for i in incidents if i.state is IncidentState.RESOLVED}
        assert opened <= resolved  # whatever opened (a stall) was resolved as it ended
        # It was only silent (a long evaluation, say): its next steps make it live again.
        # Nobody owns it now, but the replica that ended it still receives its steps.
        assert monitor.intake.watched == [job] and monitor.intake.dormant == [job]
        for n in range(12, 20):
            for rank in (0, 1):
                await bus.publish(subjects.step(job, rank), step(job, rank, n))
        await wait_for(lambda: _absent(store, keys.ended(job)), what="its end deleted")
        await wait_for(lambda: job in monitor.detectors, what="the monitor watches it again")
        await wait_for(
            lambda: controller.ownership.owns(job),
            timeout=15,
            what="the controller takes it on again",
        )
    finally:
        await running.runtime.shutdown()


async def test_a_job_claimed_after_its_ranks_went_silent_is_ended_too(
    settings: ServiceSettings, unique: str
) -> None:
    """A monitor replica that took the job over after the ranks went silent never gets
    an event of it, so it has no detector: the job is abandoned from the claim on."""
    running = await start_services(settings, ("monitor",), abandon_after_s=2.0)
    try:
        monitor = running.by_name["monitor"]
        keys, store = Keys(settings.etcd.key_prefix), monitor.store
        job = f"silent-{unique}"
        await store.put(keys.spec(job), spec(job).model_dump_json().encode())
        await wait_for(lambda: monitor.ownership.owns(job), timeout=15, what="claimed")
        end = await wait_for(lambda: store.get(keys.ended(job)), timeout=15, what="ended")
        health = JobHealth.model_validate_json(end.value)
        assert {r.state for r in health.ranks} == {RankState.EXITED} and health.step == 0
        await wait_for(lambda: _absent(store, keys.owner("monitor", job)), what="given up")
        assert job not in await live_jobs(store, keys)
        assert monitor.book.phase(job) is JobPhase.DORMANT  # not held: its steps received
    finally:
        await running.runtime.shutdown()


async def test_a_dormant_job_is_watched_whichever_replica_lives_on(
    bus: Bus, settings: ServiceSettings, unique: str
) -> None:
    """The replica that ended a silent job as abandoned is gone (redeployed, crashed)
    before the job steps on: the job is still watched, because the dormant jobs are
    marked in etcd and every replica receives their steps."""
    subjects, keys = Subjects(settings.nats.subject_prefix), Keys(settings.etcd.key_prefix)
    job = f"eval-{unique}"
    first = await start_services(
        settings, ("monitor",), abandon_after_s=2.0, replica_id=f"m-a-{unique}"
    )
    later = None
    try:
        store = first.by_name["monitor"].store
        await store.put(keys.spec(job), spec(job).model_dump_json().encode())
        for n in range(12):
            for rank in (0, 1):
                await bus.publish(subjects.step(job, rank), step(job, rank, n))
        await wait_for(lambda: store.get(keys.ended(job)), timeout=15, what="abandoned")
        assert await store.get(keys.abandoned(job)) is not None
        env = {
            "ANTDT_ETCD__ENDPOINT": settings.etcd.endpoint,
            "ANTDT_ETCD__KEY_PREFIX": settings.etcd.key_prefix,
            "COLUMNS": "250",
        }
        listed = await asyncio.to_thread(CliRunner().invoke, app, ["jobs", "list"], env=env)
        row = table_row(listed.output, job)
        assert "abandoned" in row and "dormant" in row, listed.output
        await first.runtime.shutdown()
        later = await start_services(
            settings, ("monitor",), abandon_after_s=2.0, replica_id=f"m-b-{unique}"
        )
        monitor = later.by_name["monitor"]
        await wait_for(
            lambda: job in monitor.intake.watched,
            timeout=15,
            what="the other replica receives its steps",
        )
        assert monitor.intake.dormant == [job] and not monitor.ownership.owns(job)
        for n in range(12, 20):
            for rank in (0, 1):
                await bus.publish(subjects.step(job, rank), step(job, rank, n))
        await wait_for(lambda: job in monitor.detectors, what="watched again")
        assert await store.get(keys.ended(job)) is None
        assert await store.get(keys.abandoned(job)) is None
        assert monitor.intake.dormant == [] and monitor.ownership.owns(job)
    finally:
        await first.runtime.shutdown()
        if later is not None:
            await later.runtime.shutdown()


async def test_a_finished_job_whose_end_write_failed_is_ended_as_finished_not_abandoned(
    bus: Bus, settings: ServiceSettings, unique: str
) -> None:
    """etcd refuses the one write of a finished job's end (a leader election, say): the
    replica stores it again from its tick, with the job's own last step, instead of
    keeping the job for `abandon_after_s` and ending it as abandoned at step 0."""
    running = await start_services(settings, ("monitor",), abandon_after_s=2.0)
    try:
        monitor = running.by_name["monitor"]
        subjects, keys, store = (
            Subjects(settings.nats.subject_prefix),
            _keys(settings),
            monitor.store,
        )
        job = await _registered(monitor, settings, f"done-{unique}")
        for n in range(12):
            for rank in (0, 1):
                await bus.publish(subjects.step(job, rank), step(job, rank, n))
        await wait_for(lambda: job in monitor.detectors, what="the monitor watches the job")
        real_txn, refused = store.txn, []

        async def refuse_the_first_end(compares: Any, ops: Any, *args: Any, **kw: Any) -> Any:
            if not refused and any(getattr(op, "key", None) == keys.ended(job) for op in ops):
                refused.append(ops)
                raise StoreUnavailable("refused once by the test")
            return await real_txn(compares, ops, *args, **kw)

        store.txn = refuse_the_first_end  # type: ignore[method-assign]
        for rank in (0, 1):
            await bus.publish(subjects.exit(job, rank), finished(job, rank, step=11))
        end = await wait_for(lambda: store.get(keys.ended(job)), timeout=15, what="its end")
        assert refused, "the first write of the end was refused"
        health = JobHealth.model_validate_json(end.value)
        assert health.step == 11 and {r.state for r in health.ranks} == {RankState.EXITED}
        assert await store.get(keys.abandoned(job)) is None
        owner = keys.owner("monitor", job)
        await wait_for(lambda: _absent(store, owner), what="the monitor gives it up")
        await asyncio.sleep(2.5)  # past abandon_after_s: it stays ended as it finished
        assert await store.get(keys.abandoned(job)) is None
        again = await store.get(keys.ended(job))
        assert again is not None and JobHealth.model_validate_json(again.value).step == 11
    finally:
        await running.runtime.shutdown()


async def test_a_job_lost_while_being_taken_on_is_not_watched(
    bus: Bus, settings: ServiceSettings, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's claim is lost (its lease) while its take-on reads etcd: the take-on
    gives nothing, and the replica neither watches it nor ingests its events."""
    running = await start_services(settings, ("monitor",))
    try:
        monitor = running.by_name["monitor"]
        subjects = Subjects(settings.nats.subject_prefix)
        job = await _registered(monitor, settings, f"lost-{unique}")
        real_read, real_take_on = takeon.read_job_spec, takeon.TakeOn._take_on
        taken: list[object] = []

        async def read_then_lose(*args: Any) -> Any:
            found = await real_read(*args)
            await monitor.ownership.release(job)  # as when its lease is lost meanwhile
            return found

        async def take_on(self: takeon.TakeOn, *args: Any) -> Any:
            taken.append(await real_take_on(self, *args))
            return taken[-1]

        monkeypatch.setattr(takeon, "read_job_spec", read_then_lose)
        monkeypatch.setattr(takeon.TakeOn, "_take_on", take_on)
        await bus.publish(subjects.step(job, 0), step(job, 0, 0))
        await wait_for(lambda: taken, what="a take-on")
        assert taken[0] is None and job not in monitor.detectors
    finally:
        await running.runtime.shutdown()


def _keys(settings: ServiceSettings) -> Keys:
    return Keys(settings.etcd.key_prefix)


async def _registered(monitor: Any, settings: ServiceSettings, job: str) -> str:
    """`job` registered (its spec stored) and owned by `monitor`: its id."""
    keys = _keys(settings)
    await monitor.store.put(keys.spec(job), spec(job).model_dump_json().encode())
    await monitor_owner(monitor.store, keys, job)
    return job


async def _absent(store: object, key: str) -> bool:
    return await store.get(key) is None  # type: ignore[attr-defined]
