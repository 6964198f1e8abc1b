"""The launcher's restart count against the data ledger's incarnation (issue #35)."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider

from antdt.agent import incarnation
from antdt.agent.commands import CommandHandler
from antdt.agent.timeline import StepPlans
from antdt.runtime.bus import Delivery
from antdt.runtime.telemetry.tracing_agent import AgentTraces
from antdt.schemas import KillRestart


@pytest.mark.parametrize(
    ("restart_count", "restored", "refused"),
    [(0, False, False), (0, True, False), (1, True, False), (1, False, True), (3, False, True)],
)
def test_a_restarted_group_takes_no_data_before_it_restored(
    restart_count: int, restored: bool, refused: bool
) -> None:
    problem = incarnation.before_training(restart_count, restored)
    assert (problem is not None) == refused
    if problem:
        assert f"restart count {restart_count}" in problem and "agent.restore(" in problem


@pytest.mark.parametrize(
    ("restart_count", "ledger", "corrected"),
    [
        (1, 1, False),  # one restart, one restore
        (1, 3, False),  # earlier launches of the job restored too: the ledger is ahead
        (0, 2, False),  # a new launch resuming from a checkpoint
        (3, 1, True),  # the count skipped, or restarts went by without a restore
        (2, 0, True),  # the count ahead of a ledger that never restored
    ],
)
def test_a_ledger_behind_the_launchers_count_is_corrected_by_the_ledger(
    restart_count: int, ledger: int, corrected: bool
) -> None:
    correction = incarnation.after_restore(restart_count, ledger)
    assert (correction is not None) == corrected
    if correction:
        assert f"incarnation {ledger} wins" in correction


def test_a_kill_restart_is_refused_when_the_launcher_has_no_restart_left() -> None:
    """torchrun with its --max-restarts used up ends the job on exit 75."""

    def ack(restarts_left: int | None) -> tuple[bool, str | None]:
        plans = StepPlans("j", 2)
        traces = AgentTraces("j", 0, TracerProvider())
        handler = CommandHandler("j", 0, 2, plans, traces, restarts_left=restarts_left)
        handler.restartable = True
        cmd = KillRestart(action_id="a1", job="j", rank=1, checkpoint_step=5, avoid_hosts=())
        reply = asyncio.run(handler.on_command(cmd, Delivery("cmd", {}, "")))
        return reply.ok, reply.error

    assert ack(None) == (True, None) and ack(1)[0]
    ok, error = ack(0)
    assert not ok and error is not None and "--max-restarts" in error
