"""The agent's cost on the training thread per step, collectives excluded (bench-style:
prints the figure, asserts only a loose bound; the target is < 50 µs). The agent talks to
the real controller and shards service; the monitor is left out, since it would spend
this process's CPU ingesting the step events the figure is about."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from antdt.agent import Agent
from antdt.runtime.config import ServiceSettings
from tests.integration.agent_fixtures import NullCollectives, agent_settings, real_services

pytestmark = pytest.mark.integration

STEPS = 3000
WARMUP = 200


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
    log = str(tmp_path / "ids") if sample_log else None
    cfg = agent_settings(
        settings.nats,
        unique,
        0,
        1,
        dataset_size=size,
        shard_size=20_000,
        global_batch=8,
        sample_log=log,
    )
    agent = Agent(cfg, collectives=NullCollectives())  # no other ranks: the agent's own work
    async with real_services(settings, "controller", "shards"):
        try:
            await asyncio.to_thread(agent.start)
            per_step = await asyncio.to_thread(_per_step_seconds, agent)
        finally:
            await asyncio.to_thread(agent.close)
    print(f"\nagent cost on the training thread: {per_step * 1e6:.1f} µs/step ({cfg.sample_log=})")
    assert per_step < 500e-6
    assert agent.dropped_events == 0
