"""antdt-dd through the real monitor and controller (real nats-server and etcd): a
synthetic bulk-synchronous job whose ranks differ from the start (two devices twice as
fast as the others, every device holding 16 samples at once) gets one plan, with
accumulation on the fast ranks, then nothing more, even when a rank's speed drifts later.
Step events are computed from the plan each rank holds (stand-in ranks ack the commands)."""

from __future__ import annotations

import asyncio
import time

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.schemas import (
    ACTION_STREAM,
    ActionRecord,
    ActionResult,
    JobHealth,
    JobSpec,
    Plan,
    RankHello,
    RegisterReply,
    StepEvent,
    Subjects,
)
from antdt.testing import FakeRanks, acking_ranks
from tests.e2e.conftest import start_services

pytestmark = [pytest.mark.integration, pytest.mark.slow]
WORLD, BATCH, CAP = 4, 64, 16


class SyntheticJob:
    """Per step: each rank computes its batch at its speed; the step lasts as long as the
    slowest (BSP), the others wait at the barrier. A plan runs from the later of its
    effective step and the step after the job learned of it (as the agent does)."""

    def __init__(self, bus: Bus, job: str, ranks: FakeRanks) -> None:
        self.bus, self.job, self.ranks = bus, job, ranks
        self.subjects = Subjects(bus.settings.subject_prefix)
        self.speeds = [2000.0, 2000.0, 1000.0, 1000.0]
        self.step, self.clock = 0, 1e9
        self.plan = Plan(
            job=job, version=0, local_batch=(16,) * WORLD, effective_step=0, created_at=0.0
        )
        self.learned: dict[int, int] = {}

    def current(self) -> Plan:
        known = self.ranks.plans.get(0, {})
        for version in known:
            self.learned.setdefault(version, self.step + 1)
        for version in sorted(known):
            start = max(known[version].effective_step, self.learned[version])
            if version > self.plan.version and start <= self.step:
                self.plan = known[version]
        return self.plan

    async def run_step(self) -> None:
        plan = self.current()
        compute = [b / s for b, s in zip(plan.local_batch, self.speeds, strict=True)]
        wall = max(compute) + 0.001
        for rank, b in enumerate(plan.local_batch):
            event = StepEvent(
                job=self.job,
                rank=rank,
                host=f"h{rank}",
                step=self.step,
                epoch=0,
                plan_version=plan.version,
                local_batch=b,
                samples=b,
                compute_s=compute[rank],
                data_wait_s=0.0,
                comm_s=wall - compute[rank],
                step_s=wall,
                started_at=self.clock,
                ended_at=self.clock + wall,
            )
            await self.bus.publish(self.subjects.step(self.job, rank), event)
        self.step += 1
        self.clock += wall
        await asyncio.sleep(0.004)  # the job's pace: about 250 steps per second


async def test_heterogeneous_from_the_start_one_plan_then_quiet(
    settings: ServiceSettings, bus: Bus
) -> None:
    running = await start_services(
        settings, ("monitor", "controller"), window=4, health_interval_s=0.2
    )
    job, subjects = "dd-hetero", Subjects(settings.nats.subject_prefix)
    ranks = await acking_ranks(settings.nats, job, WORLD).start()
    try:
        spec = JobSpec(
            job=job,
            world_size=WORLD,
            dataset_size=10**6,
            shard_size=100,
            global_batch=BATCH,
            policy="antdt-dd",
            policy_params={"cooldown_s": 0.0},
        )
        await bus.request(subjects.register(job), spec, RegisterReply)
        for rank in range(WORLD):
            hello = RankHello(
                job=job,
                rank=rank,
                world_size=WORLD,
                host=f"h{rank}",
                pid=rank,
                max_local_batch=CAP,
                started_at=time.time(),
            )
            await bus.publish(subjects.hello(job, rank), hello)
        synthetic = SyntheticJob(bus, job, ranks)
        deadline = time.monotonic() + 60
        while not ranks.everyone_has(1):
            assert time.monotonic() < deadline, "no dd plan within 60 s"
            await synthetic.run_step()
        plan = ranks.plans[0][1]
        assert plan.local_batch == (21, 21, 11, 11) and sum(plan.local_batch) == BATCH
        assert plan.accumulation == (2, 2, 1, 1) and plan.micro_batch == (11, 11, 11, 11)
        assert plan.reason.startswith("antdt-dd:") and plan.policy == "antdt-dd"

        # The plan runs; later rank 2 drifts 30% slower, enough for a re-plan (min_gain
        # 0.2) were it not for replan_s: the controller decides on every health tick that
        # shows the drift, and nothing more happens.
        drifted: list[JobHealth] = []

        async def on_health(health: JobHealth, _: object) -> None:
            rank2 = health.ranks[2] if len(health.ranks) == WORLD else None
            if health.plan_version == 1 and rank2 is not None and rank2.samples_per_s < 800:
                drifted.append(health)

        await bus.subscribe(subjects.health(job), JobHealth, on_health)
        while synthetic.plan.version < 1 or synthetic.step < synthetic.learned[1] + 40:
            await synthetic.run_step()
        synthetic.speeds[2] = 700.0
        while len(drifted) < 8 and 2 not in ranks.arrived:
            await synthetic.run_step()
        assert set(ranks.arrived) == {1}
        records = await bus.jetstream.read(ACTION_STREAM, subjects.action(job), ActionRecord)
        assert [(r.result, r.plan_version) for r in records.items] == [(ActionResult.APPLIED, 1)]
        assert records.items[0].accumulation == (2, 2, 1, 1)
    finally:
        await ranks.close()
        await running.runtime.shutdown()
