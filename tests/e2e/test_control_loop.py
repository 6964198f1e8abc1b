"""The whole control loop: real nats-server, etcd, the three services, 4 torch gloo ranks.

Rank 3 turns 3x slower at step 15 under policy lb-bsp. The monitor must flag it, the
controller must write a plan that every rank applies at the same step, balance efficiency
must recover, and every sample of every epoch must reach the model exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from antdt.runtime.bus import Bus, Delivery
from antdt.schemas import ActionRecord, ActionResult, Incident, JobHealth, StepEvent, Subjects
from tests.e2e.conftest import RunningServices

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.integration]

WORLD, DATASET, BATCH, EPOCHS, ONSET = 4, 6400, 256, 4, 15


def _env(settings, job: str, out: Path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    env = dict(os.environ)
    env.update(
        ANTDT_NATS__URL=settings.nats.url,
        ANTDT_NATS__SUBJECT_PREFIX=settings.nats.subject_prefix,
        ANTDT_JOB=job,
        ANTDT_POLICY="lb-bsp",
        ANTDT_DATASET_SIZE=str(DATASET),
        ANTDT_SHARD_SIZE="100",
        ANTDT_GLOBAL_BATCH=str(BATCH),
        ANTDT_EPOCHS=str(EPOCHS),
        ANTDT_SEED="3",
        ANTDT_INJECT=f"rank=3,factor=3,from={ONSET}",
        ANTDT_SAMPLE_LOG=str(out / "samples"),
        ANTDT_DEMO_OUT=str(out),
        ANTDT_DEMO_WIDTH="512",
        ANTDT_TELEMETRY__LOG_FORMAT="json",
    )
    return env


async def test_straggler_detected_plan_applied_and_samples_exactly_once(
    services: RunningServices, settings, bus: Bus, tmp_path: Path, unique: str
) -> None:  # type: ignore[no-untyped-def]
    from antdt.agent.launch import launch

    job = f"e2e-{unique}"
    subjects = Subjects(settings.nats.subject_prefix)
    steps: dict[int, list[StepEvent]] = defaultdict(list)
    health: list[JobHealth] = []
    incidents: list[Incident] = []
    actions: list[ActionRecord] = []

    async def collect(sink: list, model: object, _: Delivery) -> None:  # type: ignore[type-arg]
        sink.append(model)

    async def on_step(event: StepEvent, _: Delivery) -> None:
        steps[event.rank].append(event)

    await bus.subscribe(subjects.any_job("step.*").replace("*", job, 1), StepEvent, on_step)
    await bus.subscribe(subjects.health(job), JobHealth, lambda m, d: collect(health, m, d))
    await bus.subscribe(subjects.incident(job), Incident, lambda m, d: collect(incidents, m, d))
    await bus.subscribe(subjects.action(job), ActionRecord, lambda m, d: collect(actions, m, d))
    await bus.flush()

    command = [sys.executable, "-m", "antdt.demo.train"]
    rc = await asyncio.to_thread(launch, WORLD, command, env=_env(settings, job, tmp_path))
    assert rc == 0

    # 1. the slowed rank was detected
    slow = [i for i in incidents if i.rank == 3 and i.kind.value == "slow"]
    assert slow, f"no slow incident for rank 3: {incidents}"
    assert all(i.rank == 3 for i in incidents if i.kind.value == "slow")

    # 2. a new plan was applied by every rank, at the same step
    applied = [a for a in actions if a.result == ActionResult.APPLIED]
    assert applied, f"no applied action: {actions}"
    plan = applied[0]
    assert plan.local_batch is not None and sum(plan.local_batch) == BATCH
    assert plan.local_batch[3] < min(plan.local_batch[:3])
    assert plan.acked_ranks == (0, 1, 2, 3)
    for rank in range(WORLD):
        switch = [e.step for e in steps[rank] if e.plan_version == plan.plan_version]
        assert switch and min(switch) == plan.effective_step, (rank, switch[:3])

    # 3. efficiency recovered after the switch
    before = [h.balance_efficiency for h in health if ONSET + 8 <= h.step < plan.effective_step]
    after = [h.balance_efficiency for h in health if h.step >= plan.effective_step + 8]
    assert after and max(after[-3:]) >= 0.8, after
    if before:
        assert min(before) < 0.7, before

    # 4. every sample of every epoch reached the model exactly once
    per_epoch: dict[int, Counter[int]] = defaultdict(Counter)
    for rank in range(WORLD):
        for line in (tmp_path / f"samples.rank{rank}.jsonl").read_text().splitlines():
            record = json.loads(line)
            per_epoch[record["epoch"]].update(record["ids"])
    assert sorted(per_epoch) == list(range(EPOCHS))
    for epoch, counts in per_epoch.items():
        assert set(counts) == set(range(DATASET)), f"epoch {epoch} lost samples"
        assert max(counts.values()) == 1, f"epoch {epoch} repeated samples"
