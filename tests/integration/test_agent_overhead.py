"""The agent's cost on the training thread per step, collectives excluded (bench-style:
prints the figure, asserts only a loose bound; the target is < 50 µs)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from antdt.agent import Agent
from antdt.runtime.config import ServiceSettings
from tests.integration.test_agent_shards import FakeServices, agent_settings

pytestmark = pytest.mark.integration

STEPS = 3000
WARMUP = 200


class NullCollectives:
    """No other ranks: what remains is the agent's own work."""

    def count(self, local_samples: int) -> int:
        return local_samples

    def reduce_gradients(self, model: Any, local_samples: int) -> int:
        return local_samples


def _per_step_seconds(agent: Agent) -> float:
    epochs = agent.epochs()
    next(epochs)
    steps = agent.steps()
    model = object()
    for _ in range(WARMUP):
        next(steps).sync(model)
    start = time.perf_counter()
    for _ in range(STEPS):
        next(steps).sync(model)
    return (time.perf_counter() - start) / STEPS


@pytest.mark.parametrize("sample_log", [False, True], ids=["events", "events+sample-log"])
async def test_training_thread_cost_per_step(
    settings: ServiceSettings, unique: str, tmp_path: Path, sample_log: bool
) -> None:
    size = 8 * (STEPS + WARMUP) * 2
    fake = await FakeServices(unique, dataset_size=size, shard_size=20_000).serve(settings.nats)
    log = str(tmp_path / "ids") if sample_log else None
    cfg = agent_settings(settings.nats, unique, 0, 1, dataset_size=size, shard_size=20_000,
                         global_batch=8, sample_log=log)  # fmt: skip
    agent = Agent(cfg, collectives=NullCollectives())
    try:
        await asyncio.to_thread(agent.start)
        per_step = await asyncio.to_thread(_per_step_seconds, agent)
    finally:
        await asyncio.to_thread(agent.close)
        await fake.stop()
    print(f"\nagent cost on the training thread: {per_step * 1e6:.1f} µs/step ({cfg.sample_log=})")
    assert per_step < 500e-6
    assert agent.dropped_events == 0
