"""The demo's training script on CUDA (nccl, one GPU per rank: 2 ranks with 2 GPUs or
more, else 1) under antdt launch, against the real services: a few hundred steps, every
sample exactly once per epoch, and a model that learned."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from antdt.runtime.config import ServiceSettings
from tests.e2e.conftest import start_services
from tests.integration.agent_fixtures import assert_exactly_once, read_sample_log

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.slow]

DATASET, BATCH, EPOCHS = 24_000, 256, 3  # 94 steps an epoch: 282 steps


def demo_env(settings: ServiceSettings, job: str, out: Path) -> dict[str, str]:
    """What the demo's ranks get beside os.environ (`launch` adds it; conftest.py
    clears the suite's ANTDT_BACKEND there)."""
    return dict(
        ANTDT_NATS__URL=settings.nats.url,
        ANTDT_NATS__SUBJECT_PREFIX=settings.nats.subject_prefix,
        ANTDT_JOB=job,
        ANTDT_POLICY="lb-bsp",
        ANTDT_DATASET_SIZE=str(DATASET),
        ANTDT_SHARD_SIZE="128",
        ANTDT_GLOBAL_BATCH=str(BATCH),
        ANTDT_EPOCHS=str(EPOCHS),
        ANTDT_SEED="7",
        ANTDT_SAMPLE_LOG=str(out / "samples"),
        ANTDT_DEMO_OUT=str(out),
        ANTDT_DEMO_DEVICE="auto",
        ANTDT_TELEMETRY__LOG_FORMAT="json",
    )


async def run_demo(settings: ServiceSettings, out: Path, job: str, world: int) -> int:
    from antdt.agent.launch import launch

    running = await start_services(settings, window=8)
    try:
        command = [sys.executable, "-m", "antdt.demo.train"]
        return await asyncio.to_thread(launch, world, command, env=demo_env(settings, job, out))
    finally:
        await running.runtime.shutdown()


async def test_the_demo_trains_on_the_gpus_under_nccl(
    settings: ServiceSettings, tmp_path: Path, unique: str
) -> None:
    world = 2 if torch.cuda.device_count() >= 2 else 1
    assert await run_demo(settings, tmp_path, f"gpu-{unique}", world) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["device"] == "cuda:0"
    assert result["backend"] == "nccl"
    progress = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert len(progress) >= 250
    assert sum(p["samples"] for p in progress) == EPOCHS * DATASET
    assert_exactly_once(read_sample_log(tmp_path / "samples", world), DATASET, EPOCHS)
    assert result["accuracy"] > 0.7, result  # 10 classes: a model that learned
