"""An epoch's tail under an uneven plan, on both data paths (the agent's steps, and a
DataLoader on the agent's batch sampler): in-process ranks against the real services.
The rank that still holds data when the other runs dry takes the other's share of the
global batch, so the epoch ends in about as many steps as its samples need, not one
sample a step; no step sums past the global batch; every sample once."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from antdt.agent import Agent
from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.schemas import Ack, AdjustBatch, Plan, Subjects
from tests.integration.agent_fixtures import (
    ThreadCollectives,
    agent_settings,
    assert_exactly_once,
    close_all,
    read_sample_log,
    real_services,
    run_ranks,
    start_all,
)

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.integration

DATASET, SHARD, BATCH = 160, 10, 8
#: A straggler's plan: rank 1 takes 1 of 8 samples a step.
PLAN = (7, 1)
IDEAL = DATASET // BATCH  # 20 steps


class _Ids(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return DATASET

    def __getitem__(self, i: int) -> int:
        return i


def _through_a_loader(agent: Agent, sizes: list[int]) -> None:
    """The DataLoader path: batches on the agent's sampler, a step each."""
    data = _Ids()
    loader = torch.utils.data.DataLoader(data, batch_sampler=agent.batch_sampler(data))
    for _epoch in agent.epochs():
        for step, batch in agent.batches(loader):
            assert batch is None or batch.tolist() == step.sample_ids
            sizes.append(len(step.sample_ids))
            step.sync(object())


@pytest.mark.parametrize("path", ["steps", "dataloader"])
async def test_the_rank_with_data_left_takes_the_share_of_the_one_that_ran_out(
    settings: ServiceSettings, unique: str, bus: Bus, tmp_path: Path, path: str
) -> None:
    prefix, world = tmp_path / "samples", len(PLAN)
    collectives = ThreadCollectives(world)
    configs = [
        agent_settings(
            settings.nats,
            unique,
            r,
            world,
            dataset_size=DATASET,
            shard_size=SHARD,
            global_batch=BATCH,
            sample_log=str(prefix),
        )
        for r in range(world)
    ]
    agents = [Agent(c, collectives=collectives.rank(c.rank)) for c in configs]
    sizes: list[list[int]] = [[] for _ in agents]
    async with real_services(settings):
        try:
            await asyncio.to_thread(start_all, agents)
            plan = Plan(
                job=unique, version=1, local_batch=PLAN, effective_step=0, created_at=time.time()
            )
            subjects = Subjects(settings.nats.subject_prefix)
            command = AdjustBatch(action_id="a1", job=unique, plan=plan)
            acks = [await bus.request(subjects.command(unique, r), command, Ack) for r in (0, 1)]
            assert all(a.ok and a.applied_step == 0 for a in acks), acks
            if path == "steps":
                hooks: list[Any] = [
                    lambda step, r=r: sizes[r].append(len(step.sample_ids)) for r in range(world)
                ]
                await asyncio.to_thread(run_ranks, agents, hooks)
            else:
                await _each_on_a_thread(agents, sizes)
        finally:
            await asyncio.to_thread(close_all, agents)

    assert_exactly_once(read_sample_log(prefix, world), DATASET, epochs=1)
    steps = len(sizes[0])
    assert len(sizes[1]) == steps
    assert all(a + b <= BATCH for a, b in zip(*sizes, strict=True)), sizes
    # Rank 1 holds its shard and a prefetched one when rank 0 runs dry: at one sample a
    # step that is 10 steps or more; taking rank 0's share, one or two.
    assert max(sizes[1]) > PLAN[1], sizes
    assert steps <= IDEAL + 3, (steps, sizes)
    # The plan starts after the first step's count found both ranks holding it.
    assert [sizes[0][0], sizes[1][0]] == [BATCH // 2] * 2, sizes
    assert Counter(sizes[0])[PLAN[0]] >= IDEAL - 4


async def _each_on_a_thread(agents: list[Agent], sizes: list[list[int]]) -> None:
    await asyncio.gather(
        *(asyncio.to_thread(_through_a_loader, a, s) for a, s in zip(agents, sizes, strict=True))
    )
