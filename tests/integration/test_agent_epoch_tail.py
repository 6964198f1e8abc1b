"""An epoch's tail under an uneven plan, on both data paths (the agent's steps, and a
DataLoader on the agent's batch sampler): in-process ranks against the real services.
The rank that still holds data when the other runs dry takes the other's share of the
global batch, so the epoch ends in about as many steps as its samples need, not one
sample a step; no step sums past the global batch; every sample once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
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
    shard_status,
    start_all,
    train,
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


def _through_a_loader(
    agent: Agent, sizes: list[int], on_step: Callable[[Any], None] | None = None
) -> None:
    """The DataLoader path: batches on the agent's sampler, a step each."""
    data = _Ids()
    loader = torch.utils.data.DataLoader(data, batch_sampler=agent.batch_sampler(data))
    for _epoch in agent.epochs():
        for step, batch in agent.batches(loader):
            assert batch is None or batch.tolist() == step.sample_ids
            sizes.append(len(step.sample_ids))
            if on_step is not None:
                on_step(step)
            step.sync(object())


@pytest.mark.parametrize("path", ["steps", "dataloader"])
async def test_the_rank_with_data_left_takes_the_share_of_the_one_that_ran_out(
    settings: ServiceSettings, unique: str, bus: Bus, tmp_path: Path, path: str
) -> None:
    prefix, world = tmp_path / "samples", len(PLAN)
    agents = _agents(settings, unique, world, prefix)
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


def _agents(settings: ServiceSettings, job: str, world: int, prefix: Path) -> list[Agent]:
    """The job's `world` ranks in this process, their collectives on threads, each
    logging the samples it trains under `prefix`."""
    collectives = ThreadCollectives(world)
    configs = [
        agent_settings(
            settings.nats,
            job,
            r,
            world,
            dataset_size=DATASET,
            shard_size=SHARD,
            global_batch=BATCH,
            sample_log=str(prefix),
        )
        for r in range(world)
    ]
    return [Agent(c, collectives=collectives.rank(c.rank)) for c in configs]


async def _each_on_a_thread(agents: list[Agent], sizes: list[list[int]]) -> None:
    await asyncio.gather(
        *(asyncio.to_thread(_through_a_loader, a, s) for a, s in zip(agents, sizes, strict=True))
    )


#: A plan that gives rank 1 nothing (a job spec with min_local_batch=0).
DRAINED = (BATCH, 0)


@pytest.mark.parametrize("path", ["steps", "dataloader"])
@pytest.mark.parametrize("drained_from", [0, 5], ids=["from-the-start", "mid-epoch"])
async def test_a_rank_planned_no_samples_trains_what_it_still_holds(
    settings: ServiceSettings, unique: str, bus: Bus, tmp_path: Path, path: str, drained_from: int
) -> None:
    """Rank 1's plan drops to 0 while it holds shards: prefetched at the epoch's start
    (and reserved for it), or taken at its batch of 4 before step 5. Once rank 0 has run
    dry, rank 1 takes what it holds (at most the plan's largest local batch a step): the
    epoch ends, every sample once, no step past the global batch. Were they never taken,
    the ledger would count them in flight and the group would wait to leave the epoch
    for good."""
    prefix, world = tmp_path / "samples", len(DRAINED)
    agents = _agents(settings, unique, world, prefix)
    steps: list[list[tuple[int, int]]] = [[] for _ in agents]
    async with real_services(settings):
        try:
            await asyncio.to_thread(start_all, agents)
            plan = Plan(
                job=unique,
                version=1,
                local_batch=DRAINED,
                effective_step=drained_from,
                created_at=time.time(),
            )
            subjects = Subjects(settings.nats.subject_prefix)
            command = AdjustBatch(action_id="a1", job=unique, plan=plan)
            acks = [await bus.request(subjects.command(unique, r), command, Ack) for r in (0, 1)]
            assert all(a.ok and a.applied_step == drained_from for a in acks), acks
            hung = await asyncio.to_thread(_run_within, agents, steps, path, 30.0)
            if hung:
                status = await shard_status(bus, unique)
                held = sorted((f.rank, f.shard) for f in status.in_flight)
                pytest.fail(f"ranks {hung} still training after 30 s; in flight: {held}")
        finally:
            await asyncio.to_thread(close_all, agents)

    assert_exactly_once(read_sample_log(prefix, world), DATASET, epochs=1)
    zero, one = ([n for i, n in s if i >= drained_from] for s in steps)
    assert len(zero) == len(one)
    assert all(a + b <= BATCH for a, b in zip(zero, one, strict=True)), steps
    assert max(one) > 0, steps  # rank 1 took up what it held, after rank 0 ran dry
    assert all(b == 0 for a, b in zip(zero, one, strict=True) if a == BATCH), steps


def _run_within(
    agents: list[Agent], steps: list[list[tuple[int, int]]], path: str, timeout_s: float
) -> list[int]:
    """Train every agent on a thread of its own, recording (step, samples) per rank;
    the ranks still training after `timeout_s`."""
    errors: list[BaseException] = []

    def body(r: int) -> None:
        def record(step: Any) -> None:
            steps[r].append((step.index, len(step.sample_ids)))

        try:
            if path == "steps":
                train(agents[r], record)
            else:
                sizes: list[int] = []
                _through_a_loader(agents[r], sizes, record)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(len(agents))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, t in enumerate(threads) if t.is_alive()]
    assert hung or not errors, errors
    return hung
