"""Ended jobs leave etcd: the controller removes an ended job's keys after
`job_retention_s`, never a job registered again, and `antdt jobs` lists jobs and removes
an ended one at once (real nats-server, etcd, monitor and controller)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from typer.testing import CliRunner

from antdt.cli import app
from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.runtime.coordination.jobs import Ended, expired, read_ended, remove_job
from antdt.runtime.store import Store
from antdt.schemas import ExitReason, JobSpec, Keys, RankExit, RegisterReply, Subjects
from tests.e2e.conftest import RunningServices, start_services
from tests.helpers import step_event, table_row, wait_for

pytestmark = pytest.mark.integration
RETENTION_S = 1.5


@pytest.fixture
async def running(settings: ServiceSettings) -> AsyncIterator[RunningServices]:
    services = await start_services(
        settings,
        ("monitor", "controller"),
        window=4,
        health_interval_s=0.2,
        job_retention_s=RETENTION_S,
    )
    yield services
    await services.runtime.shutdown()


def spec(job: str) -> JobSpec:
    return JobSpec(job=job, world_size=2, dataset_size=50, shard_size=10, global_batch=8)


async def run_and_end(bus: Bus, job: str) -> None:
    """Register `job` as its agents do, step both ranks, and have both finish."""
    subjects = Subjects(bus.settings.subject_prefix)
    await bus.request(subjects.register(job), spec(job), RegisterReply)
    for n in range(3):
        for rank in range(2):
            await bus.publish(
                subjects.step(job, rank),
                step_event(job, rank, n),
            )
    for rank in range(2):  # right behind: an exit that overtakes the first step still counts
        await bus.publish(
            subjects.exit(job, rank),
            RankExit(
                job=job,
                rank=rank,
                host=f"h{rank}",
                pid=1,
                reason=ExitReason.FINISHED,
                step=2,
                at=time.time(),
            ),
        )


async def keys_of(store: Store, keys: Keys, job: str) -> list[str]:
    return [item.key for item in await store.get_prefix(keys.job(job), keys_only=True)]


async def test_an_ended_job_is_removed_after_its_retention_but_not_one_run_again(
    running: RunningServices, bus: Bus, store: Store, settings: ServiceSettings
) -> None:
    keys = Keys(settings.etcd.key_prefix)
    await run_and_end(bus, "gone")
    await run_and_end(bus, "again")
    await run_and_end(bus, "paused")  # its ranks closed mid-epoch: a later run resumes it
    await store.put(keys.ledger("paused"), b'{"job": "paused", "epoch": 0, "complete": false}')
    for job in ("gone", "again", "paused"):
        await wait_for(lambda j=job: store.get(keys.ended(j)), what=f"{job} ended")
    [seen] = await read_ended(store, keys, ["again"])
    # A new run of it, before its retention ends.
    subjects = Subjects(bus.settings.subject_prefix)
    await bus.request(subjects.register("again"), spec("again"), RegisterReply)
    ended_at = time.monotonic()
    assert not await remove_job(store, keys, seen)  # a sweep that read it before: refused

    async def gone_removed() -> bool:
        return await keys_of(store, keys, "gone") == []

    await wait_for(gone_removed, timeout=RETENTION_S + 10, what="the ended job's keys removed")
    assert time.monotonic() - ended_at >= RETENTION_S - 0.5  # not before its retention
    await asyncio.sleep(RETENTION_S)  # two more sweeps
    remaining = await keys_of(store, keys, "again")
    assert keys.spec("again") in remaining and keys.plan("again") in remaining
    assert keys.ledger("paused") in await keys_of(store, keys, "paused")


def test_the_retention_keeps_recent_and_unfinished_jobs_and_zero_keeps_them_all() -> None:
    records = [
        Ended("old", at=100.0, step=9, revision=5),
        Ended("new", at=190.0, step=9, revision=6),
        Ended("unfinished", at=100.0, step=9, revision=7, finished=False),
    ]
    assert [r.job for r in expired(records, now=200.0, retention_s=50.0)] == ["old"]
    assert expired(records, now=200.0, retention_s=0.0) == []


async def test_the_cli_lists_live_and_ended_jobs_and_removes_only_an_ended_one(
    settings: ServiceSettings, bus: Bus, store: Store
) -> None:
    services = await start_services(
        settings, ("monitor", "controller"), window=4, health_interval_s=0.2, job_retention_s=0
    )
    try:
        keys = Keys(settings.etcd.key_prefix)
        await run_and_end(bus, "done")
        await run_and_end(bus, "paused")
        await store.put(keys.ledger("paused"), b'{"complete": false}')
        await bus.request(
            Subjects(bus.settings.subject_prefix).register("busy"), spec("busy"), RegisterReply
        )
        for job in ("done", "paused"):
            await wait_for(lambda j=job: store.get(keys.ended(j)), what=f"{job} ended")
        env = {
            "ANTDT_ETCD__ENDPOINT": settings.etcd.endpoint,
            "ANTDT_ETCD__KEY_PREFIX": settings.etcd.key_prefix,
            "COLUMNS": "250",
        }
        runner = CliRunner()
        listed = await asyncio.to_thread(runner.invoke, app, ["jobs", "list"], env=env)
        assert listed.exit_code == 0, listed.output
        assert "jobs: 1 live, 2 ended" in listed.output and "at step 2" in listed.output
        paused_row = table_row(listed.output, "paused")
        assert "data unfinished" in paused_row
        assert "removed in" in table_row(listed.output, "done")  # the default: 7 days
        kept_env = {**env, "ANTDT_JOB_RETENTION_S": "0"}  # as the controllers run here
        kept = await asyncio.to_thread(runner.invoke, app, ["jobs", "list"], env=kept_env)
        assert kept.exit_code == 0 and "removed in" not in table_row(kept.output, "done")
        busy_row = table_row(listed.output, "busy")
        assert "live" in busy_row and "controller=" in busy_row
        refused = await asyncio.to_thread(runner.invoke, app, ["jobs", "remove", "busy"], env=env)
        assert refused.exit_code == 1 and "has not ended" in refused.output
        removed = await asyncio.to_thread(runner.invoke, app, ["jobs", "remove", "done"], env=env)
        assert removed.exit_code == 0 and "job done removed" in removed.output
        assert await keys_of(store, keys, "done") == [] and await keys_of(store, keys, "busy")
    finally:
        await services.runtime.shutdown()
