"""Waiting for the other ranks at a checkpoint, with real agents, the real services,
nats-server and etcd: a rank that committed learns that the checkpoint is complete from
the service's announcement, not from asking 50 times a second."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.msg import Msg

from antdt.agent import Agent
from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.schemas import CheckpointCompleted, CommitReply, ShardCommit, Subjects
from tests.e2e.conftest import RunningServices
from tests.integration.agent_fixtures import (
    ThreadCollectives,
    agent_settings,
    close_all,
    real_services,
    start_all,
)

pytestmark = pytest.mark.integration

#: How long after the first rank the second commits: past the first rank's seventh ask
#: (1.26 s at the latest, asking at 20, 40, ... ms), so that without the announcement it
#: would learn of the completion only at its eighth, 0.39 s or more later.
LATE_S = 1.3


@pytest.fixture
async def services(settings: ServiceSettings) -> AsyncIterator[RunningServices]:
    async with real_services(settings) as running:
        yield running


async def test_a_rank_waiting_at_a_checkpoint_hears_of_its_completion_at_once(
    services: RunningServices, settings: ServiceSettings, unique: str, bus: Bus
) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    commits: Counter[int] = Counter()
    announced: list[CheckpointCompleted] = []

    async def on_commit(msg: Msg) -> None:
        commits[ShardCommit.model_validate_json(msg.data).rank] += 1

    async def on_announced(msg: Msg) -> None:
        announced.append(CheckpointCompleted.model_validate_json(msg.data))

    subject = subjects.shards(unique, "commit")
    for tapped in (subject, f"{subject}.*"):  # the queue group's, and every replica's
        await bus.nc.subscribe(tapped, cb=on_commit)
    await bus.nc.subscribe(subjects.checkpointed(unique), cb=on_announced)
    await bus.flush()

    world = 2
    collectives = ThreadCollectives(world)
    agents = [
        Agent(agent_settings(settings.nats, unique, r, world), collectives=collectives.rank(r))
        for r in range(world)
    ]
    replies: dict[int, tuple[CommitReply, float]] = {}
    errors: list[BaseException] = []

    def rank_body(rank: int) -> None:
        try:
            for _ in agents[rank].epochs():
                for step in agents[rank].steps():
                    step.sync(object())
                    if rank == 1:
                        time.sleep(LATE_S)  # saving, evaluating: late to the checkpoint
                    reply = agents[rank].commit()
                    replies[rank] = (reply, time.monotonic())
                    return
        except BaseException as exc:
            errors.append(exc)

    try:
        await asyncio.to_thread(start_all, agents)
        threads = [threading.Thread(target=rank_body, args=(r,)) for r in range(world)]
        for thread in threads:
            thread.start()
        await asyncio.to_thread(_join_all, threads)
    finally:
        await asyncio.to_thread(close_all, agents)
    assert not errors, errors
    (first, first_at), (last, last_at) = replies[0], replies[1]
    assert first.complete and last.complete and last.completed_now and first.step == last.step
    assert [a.step for a in announced] == [first.step]
    # Told at once, not at its next ask (>= 0.39 s later without the announcement)...
    assert first_at - last_at < 0.25, f"rank 0 heard {first_at - last_at:.2f} s late"
    # ...and it asked a few times meanwhile, not every 20 ms (65 times).
    assert commits[0] <= 12, commits
    assert commits[1] == 1


def _join_all(threads: list[threading.Thread], timeout: Any = 60) -> None:
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a rank did not finish"
