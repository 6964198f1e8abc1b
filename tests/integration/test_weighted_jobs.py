"""`agent.weighted(model)` in real jobs: examples/fsdp2/train.py (FSDP2) and the same
script with DDP, each on two gloo ranks started by antdt.agent.launch against the real
services, with a commanded plan switch to uneven batches and uneven micro-batch counts.
The trained parameters equal one process replaying, step by step, the union of the ids
both ranks logged, with the plain mean (float64, 1e-6): the weights follow each step's
own plan."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from antdt.agent import launch
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import ServiceSettings
from antdt.schemas import Ack, AdjustBatch, Plan, StepEvent, Subjects
from tests.e2e.conftest import RunningServices
from tests.helpers import wait_for
from tests.integration.agent_fixtures import assert_exactly_once, read_sample_log, real_services

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = Path(__file__).parents[2] / "examples" / "fsdp2" / "train.py"
SIZE, EPOCHS, LR = 160, 2, 0.05
#: From step 10: rank 0 takes 6 samples in 3 micro-batches of 2, rank 1 takes 2 in one.
SWITCH = {"local_batch": (6, 2), "micro_batch": (2, 2), "accumulation": (3, 1)}


@pytest.fixture
async def services(settings: ServiceSettings) -> AsyncIterator[RunningServices]:
    async with real_services(settings) as running:
        yield running


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fsdp2_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _replay(steps: list[list[int]]) -> dict[str, Any]:
    """One process, no FSDP: each step's union of ids, the plain mean loss, SGD."""
    example = _example()
    x, y = example.make_dataset(SIZE, torch.float64).tensors
    model = example.make_model(torch.device("cpu"), torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for ids in steps:
        torch.nn.functional.mse_loss(model(x[ids]), y[ids], reduction="sum").div(
            len(ids)
        ).backward()
        opt.step()
        opt.zero_grad()
    return {name: p.detach() for name, p in model.named_parameters()}


#: The example's training loop with DDP instead of FSDP2 (same data, model and loss).
DDP_SCRIPT = textwrap.dedent(
    """
    import importlib.util, sys, torch
    from torch.nn.parallel import DistributedDataParallel
    import antdt.agent

    spec = importlib.util.spec_from_file_location("example", sys.argv[1])
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.set_num_threads(1)
    agent = antdt.agent.init()
    antdt.agent.init_process_group("gloo")
    dataset = example.make_dataset(agent.spec.dataset_size, torch.float64)
    model = DistributedDataParallel(example.make_model(torch.device("cpu"), torch.float64))
    agent.weighted(model)
    opt = torch.optim.SGD(model.parameters(), lr=float(sys.argv[3]))
    for epoch in agent.epochs():
        for step in agent.steps():
            n = len(step.sample_ids)
            for chunk in antdt.agent.accumulate(model, step.micro_batches):
                x, y = dataset[chunk]
                loss = torch.nn.functional.mse_loss(model(x), y, reduction="sum") / max(n, 1)
                loss.backward()
            step.sync(model)
            opt.step()
            opt.zero_grad()
    params = {k: p.detach() for k, p in model.module.named_parameters()}
    if agent.settings.rank == 0:
        torch.save(params, sys.argv[2])
    agent.close()
    antdt.agent.destroy_process_group()
    """
)


async def test_fsdp2_example_trains_like_one_process_on_the_union(
    services: RunningServices, settings: ServiceSettings, unique: str, bus: Bus, tmp_path: Path
) -> None:
    out = tmp_path / "params.pt"
    command = [sys.executable, str(EXAMPLE), "--out", str(out), "--dtype", "float64"]
    await _run_and_replay(settings, unique, bus, tmp_path, [*command, "--lr", str(LR)], out)


async def test_ddp_job_trains_like_one_process_on_the_union(
    services: RunningServices, settings: ServiceSettings, unique: str, bus: Bus, tmp_path: Path
) -> None:
    script, out = tmp_path / "train_ddp.py", tmp_path / "params.pt"
    script.write_text(DDP_SCRIPT)
    command = [sys.executable, str(script), str(EXAMPLE), str(out), str(LR)]
    await _run_and_replay(settings, unique, bus, tmp_path, command, out)


async def _run_and_replay(
    settings: ServiceSettings,
    unique: str,
    bus: Bus,
    tmp_path: Path,
    command: list[str],
    out: Path,
) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    events: list[StepEvent] = []

    async def on_step(event: StepEvent, _: Delivery) -> None:
        events.append(event)

    await bus.subscribe(subjects.step(unique, "*"), StepEvent, on_step)
    await bus.flush()
    log = tmp_path / "ids"
    env = {
        "ANTDT_NATS__URL": settings.nats.url,
        "ANTDT_NATS__SUBJECT_PREFIX": settings.nats.subject_prefix,
        "ANTDT_JOB": unique,
        "ANTDT_DATASET_SIZE": str(SIZE),
        "ANTDT_SHARD_SIZE": "10",
        "ANTDT_GLOBAL_BATCH": "8",
        "ANTDT_EPOCHS": str(EPOCHS),
        "ANTDT_SAMPLE_LOG": str(log),
        "ANTDT_TELEMETRY__LOG_LEVEL": "warning",
        "OMP_NUM_THREADS": "1",
    }
    run = asyncio.ensure_future(asyncio.to_thread(launch, 2, command, env=env))
    await wait_for(lambda: events or run.done(), timeout=90, what="first step event")
    new = Plan(job=unique, version=1, effective_step=10, created_at=time.time(), **SWITCH)
    command_subjects = [subjects.command(unique, r) for r in range(2)]
    acks = [
        await bus.request(s, AdjustBatch(action_id="a1", job=unique, plan=new), Ack)
        for s in command_subjects
    ]
    assert all(a.ok for a in acks) and await asyncio.wait_for(run, 240) == 0

    lines = read_sample_log(log, 2)
    assert_exactly_once(lines, SIZE, epochs=EPOCHS)
    by_step: dict[int, dict[int, list[int]]] = {}
    for rank, rank_lines in lines.items():
        for line in rank_lines:
            by_step.setdefault(line["step"], {})[rank] = line["ids"]
    assert any(len(r[0]) == 6 and len(r[1]) == 2 for r in by_step.values()), "no switch"
    steps = [by_step[s][0] + by_step[s][1] for s in sorted(by_step)]
    want = _replay(steps)
    got = torch.load(out)
    for name, value in want.items():
        diff = float((got[name] - value).abs().max())
        assert diff < 1e-6, f"{name} differs from the replay by {diff}"
