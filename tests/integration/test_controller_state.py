"""The controller's per-job state when the first events of a job arrive together: the
JobHealth and the Incident that the monitor publishes back to back right after the
controller claimed the job must land in one state (one decision lock, the health kept),
so that the incident's decision sees the health and acts. And when ranks leave: no plan
while one has exited, the state dropped once all have, and back with a hello."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from structlog.testing import capture_logs

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.schemas import (
    INCIDENT_STREAM,
    Incident,
    IncidentKind,
    IncidentState,
    JobHealth,
    JobSpec,
    RankHealth,
    RankHello,
    RankState,
    RegisterReply,
    Subjects,
)
from antdt.testing import FakeRanks, acking_ranks
from tests.e2e.conftest import start_services
from tests.helpers import wait_for

pytestmark = pytest.mark.integration
WORLD = 4


def health(job: str, away: dict[int, RankState] | None = None) -> JobHealth:
    """Rank 3 three times slower; `away`: ranks shown exited or restarting instead."""
    away = away or {}
    ranks = tuple(
        RankHealth(
            rank=r,
            host=f"h{r}",
            state=away.get(r, RankState.SLOW if r == 3 else RankState.OK),
            last_step=100,
            local_batch=16,
            samples_per_s=100.0 if r == 3 else 300.0,
            compute_s_per_sample=0.01,
            ratio=1.0,
            data_wait_share=0.0,
            comm_share=0.1,
        )
        for r in range(WORLD)
    )
    return JobHealth(
        job=job,
        at=time.time(),
        step=100,
        step_s=0.1,
        samples_per_s=1.0,
        balance_efficiency=0.5,
        plan_version=0,
        ranks=ranks,
    )


@dataclass
class LbBspJob:
    """A registered lb-bsp job with acking ranks, its controller, and a SLOW incident on
    rank 3 ready to publish."""

    job: str
    subjects: Subjects
    controller: Any
    ranks: FakeRanks
    incident: Incident
    spec: JobSpec


@contextlib.asynccontextmanager
async def lbbsp_job(
    settings: ServiceSettings, bus: Bus, job: str, **overrides: Any
) -> AsyncIterator[LbBspJob]:
    running = await start_services(settings, ("controller",), **overrides)
    subjects = Subjects(settings.nats.subject_prefix)
    ranks = await acking_ranks(settings.nats, job, WORLD).start()
    try:
        await bus.jetstream.ensure_stream(
            INCIDENT_STREAM, [subjects.any_job("incident")], max_age_s=600
        )
        spec = JobSpec(
            job=job,
            world_size=WORLD,
            dataset_size=1000,
            shard_size=10,
            global_batch=64,
            policy="lb-bsp",
        )
        await bus.request(subjects.register(job), spec, RegisterReply)
        now = time.time()
        incident = Incident(
            id="i1",
            job=job,
            rank=3,
            host="h3",
            kind=IncidentKind.SLOW,
            state=IncidentState.OPENED,
            step=100,
            opened_at=now,
            updated_at=now,
            ratio=3.0,
            windows=3,
        )
        yield LbBspJob(job, subjects, running.by_name["controller"], ranks, incident, spec)
    finally:
        await ranks.close()
        await running.runtime.shutdown()


async def test_first_health_and_incident_share_one_state(
    settings: ServiceSettings, bus: Bus
) -> None:
    async with lbbsp_job(settings, bus, "first-events") as t:
        await bus.publish(t.subjects.health(t.job), health(t.job))
        await bus.jetstream.publish(t.subjects.incident(t.job), t.incident)
        await t.ranks.wait_version(1, timeout=10)
        state = t.controller.jobs[t.job]
        assert state.health is not None and "i1" in state.incidents


async def test_no_plan_while_a_rank_is_away_and_an_ended_job_is_dropped_until_a_hello(
    settings: ServiceSettings, bus: Bus
) -> None:
    async with lbbsp_job(settings, bus, "ranks-leave") as t:
        job, subjects, controller = t.job, t.subjects, t.controller
        counts = controller.counts
        # Rank 0 is restarting: the straggler is plain to see, but a plan needs every ack.
        await bus.publish(subjects.health(job), health(job, {0: RankState.RESTARTING}))
        await bus.jetstream.publish(subjects.incident(job), t.incident)
        await wait_for(
            lambda: counts[job, "health"] == 1 and counts[job, "incident"] == 1,
            what="the health and the incident handled",
        )
        assert "i1" in controller.jobs[job].incidents
        # The policy was not even asked, and nothing was sent.
        assert counts[job, "decision"] == 0 and t.ranks.commands == 0
        await bus.publish(subjects.health(job), health(job))  # everyone back: it plans
        await t.ranks.wait_version(1, timeout=10)
        assert counts[job, "decision"] >= 1

        ended = {r: RankState.EXITED for r in range(WORLD)}
        await bus.publish(subjects.health(job), health(job, ended))
        await wait_for(lambda: job not in controller.jobs, what="the ended job dropped")
        loads, asked = controller.owned.loads, counts[job, "decision"]
        await bus.jetstream.publish(
            subjects.incident(job), t.incident.model_copy(update={"id": "i2"})
        )
        await wait_for(lambda: counts[job, "incident"] == 2, what="the late incident handled")
        # It loaded nothing and decided nothing: the job stays dropped.
        assert job not in controller.jobs and not controller.ownership.owns(job)
        assert (controller.owned.loads, counts[job, "decision"]) == (loads, asked)

        hello = RankHello(
            job=job, rank=0, world_size=WORLD, host="h0", pid=1, started_at=time.time()
        )
        await bus.publish(subjects.hello(job, 0), hello)  # the job starts over: as an
        await bus.request(subjects.register(job), t.spec, RegisterReply)  # agent does
        await wait_for(lambda: job in controller.jobs, what="the job live again")
        assert controller.owned.loads == loads + 1


async def test_incident_decisions_past_the_jobs_share_wait_for_its_health_decision(
    settings: ServiceSettings, bus: Bus
) -> None:
    """A job whose decisions took their share of the core: its incident transitions are
    learnt, counted and logged as deferred, not decided; its next health decides on them
    (the straggler of the deferred incident gets its plan)."""
    share = {"incident_decision_share": 1e-6, "incident_decision_burst_s": 1e-6}
    async with lbbsp_job(settings, bus, "deferred", **share) as t:
        job, subjects, counts = t.job, t.subjects, t.controller.counts
        # A health before any incident: decided (nothing to do), and its CPU time (far
        # more than a microsecond) overdraws the job's budget for hours.
        await bus.publish(subjects.health(job), health(job))
        await wait_for(lambda: counts[job, "decision"] == 1, what="the health decided")
        with capture_logs() as logs:
            for n in range(5):
                update = {"id": f"d{n}", "rank": 3}
                await bus.jetstream.publish(
                    subjects.incident(job), t.incident.model_copy(update=update)
                )
            await wait_for(lambda: counts[job, "incident"] == 5, what="the incidents handled")
        assert counts[job, "deferred"] == 5 and counts[job, "decision"] == 1
        assert t.ranks.commands == 0
        assert set(t.controller.jobs[job].incidents) >= {f"d{n}" for n in range(5)}
        deferred = [e for e in logs if e["event"].startswith("incident decisions deferred")]
        assert [e["incident"] for e in deferred] == ["d0"]  # once, when deferring starts
        await bus.publish(subjects.health(job), health(job))
        await t.ranks.wait_version(1, timeout=10)
        assert counts[job, "decision"] == 2
