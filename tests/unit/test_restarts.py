"""KILL_RESTART bookkeeping (pure): guardrails before acting, the ledger, ack tallies and
the restart cost measured from JobHealth (time is a value)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from antdt.schemas import Ack, ErrorReply, JobHealth, PendingRestart, RestartLedger
from antdt.schemas.restarts import MAX_COSTS
from antdt.services.controller.acks import AckTally
from antdt.services.controller.guardrails import Guardrails
from antdt.services.controller.policies import KillRestartAction
from antdt.services.controller.restarts import (
    Progress,
    abandon,
    begin,
    blocklist_entry,
    kill_command,
    observe,
    restart_violation,
)
from tests.unit.test_policies import JOB, STRAGGLER, health, view

ACTION = KillRestartAction(
    action_id=f"{JOB}-restart-1",
    rank=3,
    host="h3",
    reason="slow",
    incident_id="inc-1",
    local_batch_after=(32, 32, 32, 32),
)


def pending(step: int = 50, **fields: object) -> PendingRestart:
    base = PendingRestart(
        action_id=ACTION.action_id,
        rank=3,
        host="h3",
        checkpoint_step=step,
        decided_at=100.0,
        step_s=0.2,
    )
    return base.model_copy(update=fields)


def at(step: int, t: float, step_s: float = 0.1) -> JobHealth:
    return health(STRAGGLER, step=step).model_copy(update={"at": t, "step_s": step_s})


# ------------------------------------------------------------------- guardrails


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({}, ""),
        ({"rank": 4}, "rank 4 is not in the job"),
        ({"host": "h9"}, "rank 3 runs on h3, not on h9"),
    ],
)
def test_restart_violation_of_the_action(change: dict, reason: str) -> None:
    v = replace(view(), hosts={3: "h3"})
    assert restart_violation(v, replace(ACTION, **change), Guardrails()).startswith(reason)


@pytest.mark.parametrize(
    ("ledger", "reason"),
    [
        (RestartLedger(count=2), "restart budget used (2 of 2)"),
        (RestartLedger(count=1, pending=pending(decided_at=990.0)), "a restart is in flight"),
        (RestartLedger(count=1, pending=pending(decided_at=300.0)), ""),  # timed out
        (RestartLedger(count=1, last_decided_at=990.0), "restart cooling down"),
        (RestartLedger(count=1, last_decided_at=900.0), ""),
    ],
)
def test_restart_violation_of_the_history(ledger: RestartLedger, reason: str) -> None:
    v = replace(view(now=1000.0), restarts=ledger)
    assert restart_violation(v, ACTION, Guardrails()) == reason


# ------------------------------------------------------------------------ ledger


def test_begin_uses_budget_and_marks_the_restart_in_flight() -> None:
    ledger = begin(
        RestartLedger(costs=(9.0,)), ACTION, checkpoint_step=57, decided_at=10.0, step_s=0.3
    )
    assert ledger.count == 1 and ledger.costs == (9.0,)
    assert (ledger.last_decided_at, ledger.last_checkpoint_step) == (10.0, 57)
    assert ledger.pending is not None
    assert ledger.pending.local_batch_after == (32, 32, 32, 32)
    assert ledger.pending.incident_id == "inc-1"
    assert abandon(ledger).pending is None and abandon(ledger).count == 1


def test_the_blocklist_entry_ends_after_its_ttl_or_never() -> None:
    entry = blocklist_entry(ACTION, JOB, at=10.0, ttl_s=60.0)
    assert (entry.host, entry.rank, entry.action_id) == ("h3", 3, ACTION.action_id)
    assert (entry.at, entry.until) == (10.0, 70.0)
    assert blocklist_entry(ACTION, JOB, at=10.0, ttl_s=0.0).until is None


def test_kill_command_avoids_the_host_and_the_blocklist() -> None:
    command = kill_command(pending(57), JOB, frozenset({"h7", "h3"}))
    assert command.avoid_hosts == ("h3", "h7")
    assert (command.rank, command.checkpoint_step, command.action_id) == (3, 57, ACTION.action_id)


# ------------------------------------------------------------------------- acks


def ack(rank: int, *, ok: bool = True, step: int | None = 57, **fields: object) -> Ack:
    base = Ack(action_id=ACTION.action_id, job=JOB, rank=rank, ok=ok, applied_step=step, at=1.0)
    return base.model_copy(update=fields)


def test_tally_counts_every_rank_once() -> None:
    tally = AckTally(kill_command(pending(57), JOB, frozenset()), world_size=4)
    for rank in (0, 1, 1, 2):
        tally.add(ack(rank))
    assert sorted(tally.ok) == [0, 1, 2] and tally.pending == [3] and not tally.complete
    tally.add(ack(3, ok=False, step=None, error="step 57 already passed"))
    assert tally.complete and tally.refused == {3: "step 57 already passed"}
    assert tally.error() == "rank 3: step 57 already passed"


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (ack(7), "ack from rank 7, outside the job"),
        (ack(1, action_id="other"), f"ack for {JOB}/other"),
        (ack(1, job="job2"), f"ack for job2/{ACTION.action_id}"),
        (ack(1, step=60), "rank 1 acked step 60, not 57"),
        (
            ErrorReply(error="kill_restart for rank 3 sent to 1", code="bad_request"),
            "error reply: bad_request",
        ),
    ],
)
def test_tally_refuses_what_is_not_an_ack(reply: Ack | ErrorReply, reason: str) -> None:
    tally = AckTally(kill_command(pending(57), JOB, frozenset()), world_size=4)
    tally.add(reply)
    assert not tally.ok and not tally.refused
    assert tally.rejected[0].startswith(reason)
    assert "no ack from rank 0" in (tally.error() or "")


# ------------------------------------------------------------------- measurement


def fold(ledger: RestartLedger, healths: list[JobHealth], restarted: bool = True) -> tuple:
    progress, costs = None, []
    for h in healths:
        ledger, progress, cost = observe(ledger, progress, h, restarted)
        costs.append(cost)
    return ledger, progress, costs


def test_cost_from_checkpoint_to_resume() -> None:
    ledger = RestartLedger(count=1, pending=pending(50))
    down = [at(45, 200.0), at(49, 201.0), at(50, 202.0), at(50, 203.0), at(50, 210.0)]
    ledger, progress, costs = fold(ledger, down)
    assert costs == [None] * 5 and progress == Progress(50, 202.0)
    assert ledger.pending is not None
    # Resumed: step 53 seen at 215.5 -> step 51 ended at 215.3; minus one step of 0.1 s.
    ledger, progress, costs = fold(ledger, [*down, at(53, 215.5)])
    assert costs[-1] == pytest.approx(215.5 - 0.2 - 202.0 - 0.1)
    assert ledger.pending is None and ledger.costs == (costs[-1],) and ledger.count == 1
    assert ledger.measured_cost_s == costs[-1] and progress is None


def test_cost_when_the_last_step_before_the_checkpoint_was_not_seen() -> None:
    """The job stops at 50 but health stays at 48: two steps (of the 0.2 s known when the
    restart was decided) are taken off the stop time."""
    ledger = RestartLedger(count=1, pending=pending(50))
    ledger, _, costs = fold(ledger, [at(48, 100.0), at(48, 105.0), at(51, 110.0)])
    assert costs[-1] == pytest.approx(110.0 - (100.0 + 2 * 0.2) - 0.1)


def test_costs_keep_the_newest() -> None:
    ledger = RestartLedger(costs=tuple(float(i) for i in range(MAX_COSTS)), pending=pending(50))
    ledger, _, costs = fold(ledger, [at(50, 100.0), at(51, 110.0)])
    assert costs[-1] == pytest.approx(9.9)
    assert len(ledger.costs) == MAX_COSTS and ledger.costs[-1] == costs[-1]
    assert ledger.costs[0] == 1.0


@pytest.mark.parametrize(
    ("healths", "restarted"),
    [
        ([at(60, 300.0)], True),  # past the checkpoint before any sighting (a takeover)
        ([at(50, 300.0), at(56, 300.6)], False),  # no new rank process: no restart
    ],
)
def test_not_measured(healths: list[JobHealth], restarted: bool) -> None:
    ledger, _, costs = fold(RestartLedger(count=1, pending=pending(50)), healths, restarted)
    assert costs[-1] is None and ledger.pending is None and ledger.costs == ()
    assert ledger.count == 1


def test_waits_a_few_steps_for_the_hellos_of_the_new_processes() -> None:
    ledger = RestartLedger(count=1, pending=pending(50))
    ledger, progress, costs = fold(ledger, [at(50, 300.0), at(55, 310.0)], restarted=False)
    assert costs == [None, None] and ledger.pending is not None
    ledger, _, cost = observe(ledger, progress, at(56, 310.1), True)
    assert cost == pytest.approx(310.1 - 5 * 0.1 - 300.0 - 0.1)


def test_nothing_in_flight_nothing_changes() -> None:
    ledger = RestartLedger(count=1)
    assert observe(ledger, None, at(60, 300.0), True) == (ledger, None, None)


def test_negative_cost_is_clamped() -> None:
    ledger = RestartLedger(pending=pending(50))
    assert fold(ledger, [at(50, 300.0), at(55, 300.1)])[2][-1] == 0.0
