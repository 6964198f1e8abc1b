"""KILL_RESTART bookkeeping (pure): guardrails before acting, the ledger, ack tallies and
the restart cost measured from JobHealth (time is a value)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from antdt.schemas import Ack, ErrorReply, JobHealth, PendingRestart, RestartLedger
from antdt.schemas.restarts import MAX_COSTS
from antdt.services.controller.guardrails import Guardrails
from antdt.services.controller.policies import KillRestartAction
from antdt.services.controller.restarts import (
    AckTally,
    abandon,
    begin,
    kill_command,
    observe,
    restart_violation,
)
from tests.unit.test_policies import JOB, STRAGGLER, health, view

ACTION = KillRestartAction(
    action_id=f"{JOB}-restart-1", rank=3, host="h3", reason="slow", incident_id="inc-1",
    local_batch_after=(32, 32, 32, 32),
)  # fmt: skip


def pending(step: int = 50, **fields: object) -> PendingRestart:
    base = PendingRestart(action_id=ACTION.action_id, rank=3, host="h3", checkpoint_step=step,
                          decided_at=100.0, step_s=0.2)  # fmt: skip
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
    ledger = begin(RestartLedger(costs=(9.0,)), ACTION, checkpoint_step=57, decided_at=10.0,
                   step_s=0.3)  # fmt: skip
    assert ledger.count == 1 and ledger.costs == (9.0,)
    assert (ledger.last_decided_at, ledger.last_checkpoint_step) == (10.0, 57)
    assert ledger.pending is not None
    assert ledger.pending.local_batch_after == (32, 32, 32, 32)
    assert ledger.pending.incident_id == "inc-1"
    assert abandon(ledger).pending is None and abandon(ledger).count == 1


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
        (ErrorReply(error="kill_restart for rank 3 sent to 1", code="bad_request"),
         "error reply: bad_request"),
    ],
)  # fmt: skip
def test_tally_refuses_what_is_not_an_ack(reply: Ack | ErrorReply, reason: str) -> None:
    tally = AckTally(kill_command(pending(57), JOB, frozenset()), world_size=4)
    tally.add(reply)
    assert not tally.ok and not tally.refused
    assert tally.rejected[0].startswith(reason)
    assert "no ack from rank 0" in (tally.error() or "")


# ------------------------------------------------------------------- measurement


def test_cost_from_checkpoint_to_resume() -> None:
    ledger = RestartLedger(count=1, pending=pending(50))
    timeline = [at(45, 200.0), at(49, 201.0), at(50, 202.0), at(50, 203.0), at(50, 210.0)]
    for h in timeline:
        ledger, cost = observe(ledger, h)
        assert cost is None
    assert ledger.pending is not None and ledger.pending.checkpoint_at == 202.0
    # Resumed: step 53 seen at 215.5 -> step 51 ended at 215.3; minus one step of 0.1 s.
    ledger, cost = observe(ledger, at(53, 215.5))
    assert cost == pytest.approx(215.5 - 0.2 - 202.0 - 0.1)
    assert ledger.pending is None and ledger.costs == (cost,) and ledger.count == 1
    assert ledger.measured_cost_s == cost


def test_costs_keep_the_newest() -> None:
    ledger = RestartLedger(costs=tuple(float(i) for i in range(MAX_COSTS)),
                           pending=pending(50, checkpoint_at=100.0))  # fmt: skip
    ledger, cost = observe(ledger, at(51, 110.0))
    assert cost == pytest.approx(9.9)
    assert len(ledger.costs) == MAX_COSTS and ledger.costs[-1] == cost and ledger.costs[0] == 1.0


def test_past_the_checkpoint_unseen_is_not_measured() -> None:
    ledger, cost = observe(RestartLedger(count=1, pending=pending(50)), at(60, 300.0))
    assert cost is None and ledger.pending is None and ledger.costs == ()


def test_nothing_in_flight_nothing_changes() -> None:
    ledger = RestartLedger(count=1)
    assert observe(ledger, at(60, 300.0)) == (ledger, None)


def test_negative_cost_is_clamped() -> None:
    ledger = RestartLedger(pending=pending(50, checkpoint_at=300.0))
    assert observe(ledger, at(55, 300.1))[1] == 0.0
