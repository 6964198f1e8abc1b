"""The one ack tally on an AdjustBatch (the KillRestart side: test_restarts.py), the
plan builder's first plan, and the executor's dispatch on the action's kind."""

from __future__ import annotations

import time

import pytest

from antdt.schemas import Ack, ActionResult, AdjustBatch, JobSpec, Plan
from antdt.services.controller.acks import AckTally, ack_result
from antdt.services.controller.actions import Action, AdjustBatchAction, KillRestartAction
from antdt.services.controller.plans import initial_plan
from antdt.services.controller.records import adjust_record, restart_record

SPEC = JobSpec(job="j", world_size=3, dataset_size=100, shard_size=10, global_batch=12)
PLAN = Plan(job="j", version=2, local_batch=(4, 4, 4), effective_step=9, created_at=1.0)
COMMAND = AdjustBatch(action_id="j-plan-2", job="j", plan=PLAN)


def ack(rank: int, *, ok: bool = True, version: int | None = 2, **fields: object) -> Ack:
    base = Ack(action_id="j-plan-2", job="j", rank=rank, ok=ok, plan_version=version, at=1.0)
    return base.model_copy(update=fields)


def test_an_adjust_batch_ack_counts_for_the_rank_it_was_sent_to_at_the_plan_version() -> None:
    tally = AckTally(COMMAND, world_size=3)
    assert tally.add(ack(0), sent_to=0) == ""
    assert tally.add(ack(1, version=None), sent_to=1) == ""  # an agent that says no version
    assert tally.add(ack(0), sent_to=2) == "ack from rank 0 to a command for rank 2"
    assert tally.add(ack(2, version=1), sent_to=2) == "rank 2 acked plan version 1, not 2"
    assert (tally.acked, tally.pending, tally.result) == ([0, 1], [2], ActionResult.PARTIAL)


def test_an_adjust_batch_refusal_leaves_the_rank_to_be_asked_again() -> None:
    tally = AckTally(COMMAND, world_size=3)
    tally.add(ack(2, ok=False, version=None, error="busy"), sent_to=2)
    assert tally.refused == {} and tally.pending == [0, 1, 2]
    for rank in range(3):
        tally.add(ack(rank), sent_to=rank)
    assert tally.complete and tally.result == ActionResult.APPLIED and tally.error() is None


def test_a_broadcasts_acks_are_counted_in_time_linear_in_the_ranks() -> None:
    """The sender asks `complete` after every reply of a broadcast: at 10,000 ranks a
    list of the ranks pending each time made 100,000,000 steps (8 s on the controller's
    event loop per plan). 50,000 acks, one `complete` after each, in well under the
    minutes the quadratic tally takes."""
    world = 50_000
    plan = PLAN.model_copy(update={"local_batch": (1,) * world})
    tally = AckTally(COMMAND.model_copy(update={"plan": plan}), world_size=world)
    replies = [ack(rank) for rank in range(world)]
    started = time.process_time()
    done = [tally.add(reply) == "" and tally.complete for reply in replies]
    assert time.process_time() - started < 5.0
    assert done.count(True) == 1 and done[-1] and tally.result == ActionResult.APPLIED


@pytest.mark.parametrize(
    ("acked", "result"),
    [(3, ActionResult.APPLIED), (1, ActionResult.PARTIAL), (0, ActionResult.FAILED)],
)
def test_ack_result(acked: int, result: ActionResult) -> None:
    assert ack_result(acked, 3) == result


def test_the_initial_plan_is_equal_shares_from_step_zero() -> None:
    plan = initial_plan(SPEC, now=5.0)
    assert (plan.version, plan.local_batch, plan.effective_step) == (0, (4, 4, 4), 0)
    assert (plan.policy, plan.created_at) == (SPEC.policy, 5.0)


def test_each_action_kind_names_its_record() -> None:
    adjust: Action = AdjustBatchAction("j-plan-3", (6, 3, 3), "faster rank 0", source="p")
    restart: Action = KillRestartAction("j-restart-1", rank=2, host="h2", reason="slow")
    made = adjust_record(SPEC, adjust, ActionResult.REFUSED, decided_at=1.0, completed_at=2.0)
    assert (made.kind, made.policy, made.missing_ranks) == ("adjust_batch", "p", ())
    sent = restart_record(
        SPEC,
        restart.action_id,
        restart.reason,
        ActionResult.PARTIAL,
        rank=2,
        host="h2",
        incident_id=None,
        decided_at=1.0,
        completed_at=2.0,
        step=40,
        acked=[0, 1],
    )
    assert (sent.kind, sent.effective_step, sent.missing_ranks) == ("kill_restart", 40, (2,))
