"""A restart count that disagrees with the data ledger's incarnation (issue #35), against
the real services: a restarted process that would train without restoring is refused
before it takes data; a count ahead of the ledger is corrected by it, and logged and
counted; either way every sample reaches the model exactly once."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from antdt.agent import Agent, RestartMismatch
from antdt.agent.samplelog import exactly_once_problems, read_sample_logs
from antdt.runtime.config import ServiceSettings
from tests.integration.agent_fixtures import (
    ThreadCollectives,
    agent_settings,
    close_all,
    real_services,
    start_all,
)

pytestmark = pytest.mark.integration

WORLD, SIZE, CHECKPOINT, DIES_AFTER = 2, 50, 3, 5


def ranks(settings: ServiceSettings, job: str, prefix: Path, restart_count: int) -> list[Agent]:
    coll = ThreadCollectives(WORLD)
    configs = [
        agent_settings(
            settings.nats, job, r, WORLD, sample_log=str(prefix), restart_count=restart_count
        )
        for r in range(WORLD)
    ]
    return [Agent(c, collectives=coll.rank(c.rank)) for c in configs]


def train(agent: Agent, restore_to: int | None, stop_after: int | None) -> None:
    """The documented loop: restore (restarted runs), commit at CHECKPOINT, and (first
    run) stop mid-epoch after `stop_after`, as a killed group would."""
    if restore_to is not None:
        agent.restore(restore_to)
    for _ in agent.epochs():
        for step in agent.steps():
            step.sync(object())
            if step.index == CHECKPOINT and restore_to is None:
                agent.commit(step.index)
            if step.index == stop_after:
                return


def run_threads(agents: list[Agent], restore_to: int | None, stop_after: int | None) -> None:
    errors: list[BaseException] = []

    def body(agent: Agent) -> None:
        try:
            train(agent, restore_to, stop_after)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(a,)) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


async def test_a_restart_count_out_of_step_with_the_ledger_loses_nothing(
    settings: ServiceSettings, unique: str, tmp_path: Path
) -> None:
    prefix = tmp_path / "samples"
    async with real_services(settings):
        first = ranks(settings, unique, prefix, restart_count=0)
        await asyncio.to_thread(start_all, first)
        await asyncio.to_thread(run_threads, first, None, DIES_AFTER)
        await asyncio.to_thread(close_all, first)

        # The launcher's count skipped to 3 (the ledger saw no restart yet).
        again = ranks(settings, unique, prefix, restart_count=3)
        await asyncio.to_thread(start_all, again)
        try:
            with pytest.raises(RestartMismatch, match="restart count 3"):
                again[0].epochs()  # no restore(): refused before any fetch
            await asyncio.to_thread(run_threads, again, CHECKPOINT, None)
        finally:
            await asyncio.to_thread(close_all, again)
    assert [a.incarnation_corrections for a in again] == [1, 1]
    lines = read_sample_logs(prefix, WORLD)
    assert exactly_once_problems(lines, SIZE, 1) == []
    assert {(ln["incarnation"], ln["restored"]) for ln in lines if "restored" in ln} == {
        (1, CHECKPOINT)
    }
