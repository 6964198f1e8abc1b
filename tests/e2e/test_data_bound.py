"""A data-bound rank (issue #36): 2 gloo ranks of a DDP + DataLoader job, one per core,
whose rank 1 does real extra work in its dataset's `__getitem__` from step ~120 (the
DataLoader's wait is the step's data wait): the monitor names the cause (data), lb-bsp
cuts that rank's batch, and every sample still reaches the model exactly once."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from antdt.agent.samplelog import exactly_once_problems, read_sample_logs
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import ServiceSettings
from antdt.schemas import ActionRecord, ActionResult, Cause, Incident, IncidentKind, Subjects
from antdt.testing import cores, foreground
from tests.e2e.conftest import start_services
from tests.helpers import job_env

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.integration,
]

WORLD, DATASET, BATCH, EPOCHS, SLOW_RANK, ONSET = 2, 16384, 128, 3, 1, 120
SCRIPT = Path(__file__).with_name("data_bound_train.py")
ROOT = Path(__file__).resolve().parents[2]


async def test_a_data_bound_rank_is_named_by_cause_and_its_batch_cut(
    settings: ServiceSettings, bus: Bus, tmp_path: Path, unique: str
) -> None:
    if len(cores()) < WORLD:
        pytest.skip(f"pins {WORLD} ranks one per core: this process may use {len(cores())}")
    job = f"data-{unique}"
    subjects = Subjects(settings.nats.subject_prefix)
    incidents: list[Incident] = []
    actions: list[ActionRecord] = []

    async def on_incident(incident: Incident, _: Delivery) -> None:
        incidents.append(incident)

    async def on_action(record: ActionRecord, _: Delivery) -> None:
        actions.append(record)

    await bus.subscribe(subjects.incident(job), Incident, on_incident)
    await bus.subscribe(subjects.action(job), ActionRecord, on_action)
    await bus.flush()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        **job_env(
            settings,
            job,
            ANTDT_POLICY="lb-bsp",
            ANTDT_DATASET_SIZE=str(DATASET),
            ANTDT_SHARD_SIZE="256",
            ANTDT_GLOBAL_BATCH=str(BATCH),
            ANTDT_EPOCHS=str(EPOCHS),
            ANTDT_SAMPLE_LOG=str(tmp_path / "samples"),
            ANTDT_TEST_SLOW_DATA=f"rank={SLOW_RANK},after={ONSET * BATCH // WORLD},loops=20000",
        ),
    }
    pinned = ",".join(str(c) for c in cores()[:WORLD])
    argv = [sys.executable, "-m", "antdt.cli", "launch", "--nproc", str(WORLD), "--cores", pinned]
    running = await start_services(settings, window=8)
    try:
        with foreground():
            proc = await asyncio.create_subprocess_exec(
                *argv, "--", sys.executable, str(SCRIPT), env=env
            )
            rc = await asyncio.wait_for(proc.wait(), 240)
    finally:
        await running.runtime.shutdown()
    assert rc == 0

    # 1. the monitor named the cause: data, on the slowed rank
    data = [i for i in incidents if i.kind == IncidentKind.SLOW and i.cause == Cause.DATA]
    seen = [(i.rank, i.cause.value, i.state.value, i.step) for i in incidents]
    assert any(i.rank == SLOW_RANK for i in data), seen

    # 2. its batch was cut below an even share
    cut = [
        a
        for a in actions
        if a.result == ActionResult.APPLIED
        and a.kind == "adjust_batch"
        and a.local_batch
        and a.local_batch[SLOW_RANK] < BATCH // WORLD
    ]
    assert cut, actions
    first = cut[0].effective_step or 0
    print(f"rank {SLOW_RANK} cut to {cut[0].local_batch} from step {first}; incidents {seen}")
    # Until then no other rank was taken for data-bound (once the cut moved the samples,
    # the other rank loads nearly all of them: its own wait may then stand out).
    assert not [i for i in data if i.rank != SLOW_RANK and i.step < first], seen

    # 3. and every sample of every epoch reached the model exactly once
    lines = read_sample_logs(tmp_path / "samples", WORLD)
    assert exactly_once_problems(lines, DATASET, EPOCHS) == []
