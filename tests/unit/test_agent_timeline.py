"""The step cursor and the plans it runs under, and the commands judged against it (no
I/O: commands are handed to the handler as the bus would)."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider

from antdt.agent.commands import CommandHandler
from antdt.agent.errors import AgentError
from antdt.agent.plans import Verdict
from antdt.agent.timeline import StepPlans
from antdt.runtime.bus import Delivery, Rejected
from antdt.runtime.telemetry.tracing_agent import AgentTraces
from antdt.schemas import Ack, AdjustBatch, KillRestart, Plan


def plan(version: int, effective: int, batch: tuple[int, int] = (4, 4)) -> Plan:
    return Plan(
        job="j", version=version, local_batch=batch, effective_step=effective, created_at=1.0
    )


def registered() -> StepPlans:
    plans = StepPlans("j", 2)
    plans.adopt(plan(0, 0))
    return plans


def counted(*ranks: StepPlans) -> None:
    """A step's count between `ranks` (the job's ranks, each with its step fixed): their
    newest plan versions and squares summed, as StepDriver.count carries them."""
    newest = [r.newest_version for r in ranks]
    for r in ranks:
        r.agree(sum(newest), sum(v * v for v in newest))


def test_a_plan_offered_while_a_step_is_fixed_starts_at_the_step_after() -> None:
    plans, other = registered(), registered()
    assert plans.fix() == (0, plan(0, 0)) and other.fix() == (0, plan(0, 0))
    judgement, at = plans.offer(plan(1, 0, (2, 6)))
    assert (judgement.verdict, at) == (Verdict.ACCEPT, 1)
    other.offer(plan(1, 0, (2, 6)))
    assert plans.fix() == (0, plan(0, 0))  # step 0 keeps the plan fixed for it
    counted(plans, other)  # step 0's count: both hold plan 1
    plans.began()
    assert plans.step == 1 and plans.fix()[1].version == 1


def test_a_late_plan_starts_at_one_step_on_ranks_that_got_it_at_different_times() -> None:
    """Plan 1 (effective at step 2) reaches rank a before it fixes step 4 and rank b only
    after: each taking it at its next open step, a ran step 4 under it and b under plan
    0 (with work sharing, offers made from two plans: the ranks' collectives diverged).
    Both switch after the first count that finds both holding it."""
    a, b = registered(), registered()
    for _ in range(4):
        for r in (a, b):
            r.fix()
            r.began()
    a.offer(plan(1, 2, (2, 6)))
    ran: dict[str, list[int]] = {"a": [], "b": []}
    for step in range(4, 8):
        for name, r in (("a", a), ("b", b)):
            assert r.fix()[0] == step
            ran[name].append(r.fix()[1].version)
        counted(a, b)
        if step == 4:
            b.offer(plan(1, 2, (2, 6)))
        for r in (a, b):
            r.began()
    assert ran["a"] == ran["b"] == [0, 0, 1, 1]


def test_ranks_holding_different_newest_plans_agree_on_none() -> None:
    a, b = registered(), registered()
    a.offer(plan(1, 0))
    a.offer(plan(2, 0))
    b.offer(plan(1, 0))
    for r in (a, b):
        r.fix()
    counted(a, b)  # 2 + 1 = 2 x 1.5: no single version, though the sum is even
    for r in (a, b):
        r.began()
        assert r.fix()[1].version == 0
    b.offer(plan(2, 0))
    counted(a, b)
    for r in (a, b):
        r.began()
        assert r.fix()[1].version == 2


def test_a_step_fixed_but_not_begun_keeps_its_index_and_plan() -> None:
    """An epoch that ends on a step's empty take: its index and plan go to the next
    epoch's first step, and a plan offered meanwhile still starts after it."""
    plans = registered()
    plans.fix()
    assert plans.offer(plan(1, 0, (2, 6)))[1] == 1
    counted(plans, plans)  # (a job of two ranks holding plan 1)
    assert plans.fix() == (0, plan(0, 0)) and plans.step == 0
    assert plans.first_open == 1 and plans.plan.version == 1


def test_without_a_fixed_step_a_plan_starts_at_the_next_step_or_its_own() -> None:
    plans = registered()
    for _ in range(3):
        plans.fix()
        plans.began()
    assert plans.offer(plan(1, 0))[1] == 3  # its effective step has passed
    assert plans.offer(plan(2, 9))[1] == 9
    judgement, at = plans.offer(plan(2, 9).model_copy(update={"created_at": 5.0}))
    assert (judgement.verdict, at) == (Verdict.SAME, 9)  # a resend names the same step
    assert plans.offer(plan(1, 0))[0].verdict is Verdict.STALE


def test_rewind_moves_the_cursor_and_unfixes_the_plan() -> None:
    plans = registered()
    plans.fix()
    plans.rewind(41)
    assert plans.step == 41 and plans.first_open == 41
    assert plans.offer(plan(1, 0))[1] == 41


def test_the_registered_plan_yields_to_a_newer_commanded_one_and_must_fit() -> None:
    plans = StepPlans("j", 2)
    plans.offer(plan(3, 0, (1, 7)))  # a command came before registration answered
    plans.adopt(plan(0, 0))
    assert plans.plan.version == 0  # until a count finds every rank holding plan 3
    plans.agree(2 * 3, 2 * 9)
    assert plans.plan.version == 3
    with pytest.raises(AgentError, match="registered plan unusable"):
        StepPlans("j", 3).adopt(plan(0, 0))


def handler(plans: StepPlans) -> CommandHandler:
    return CommandHandler("j", 0, 2, plans, AgentTraces("j", 0, TracerProvider()))


def command(h: CommandHandler, cmd: AdjustBatch | KillRestart) -> Ack:
    return asyncio.run(h.on_command(cmd, Delivery("cmd.0", {}, "")))


def test_kill_restart_is_judged_against_the_first_step_whose_plan_is_open() -> None:
    plans = registered()
    h = handler(plans)
    h.restartable = True
    plans.fix()  # step 0 is under way: a checkpoint at it would come too late
    late = KillRestart(action_id="k0", job="j", rank=1, checkpoint_step=0, avoid_hosts=())
    assert not command(h, late).ok
    ok = command(h, late.model_copy(update={"action_id": "k1", "checkpoint_step": 1}))
    assert ok.ok and ok.applied_step == 1
    assert (h.restart_due(0), h.restart_due(1), h.received) == (False, True, 2)


@pytest.mark.parametrize("refused_on_one", [True, False])
def test_a_restart_some_rank_refused_is_dropped_by_every_rank(refused_on_one: bool) -> None:
    """torchrun counts restarts per node: a node with none left refuses the restart the
    others take. Those would checkpoint and wait at the commit for it, which trains on;
    the checkpoint step's count finds the votes short, and nobody restarts."""
    ranks = [registered(), registered()]
    handlers = [
        CommandHandler("j", r, 2, plans, AgentTraces("j", r, TracerProvider()), restarts_left=left)
        for r, (plans, left) in enumerate(zip(ranks, (0 if refused_on_one else 1, 1), strict=True))
    ]
    restart = KillRestart(action_id="k1", job="j", rank=1, checkpoint_step=2, avoid_hosts=())
    for h in handlers:
        h.restartable = True
    acks = [command(h, restart) for h in handlers]
    assert [a.ok for a in acks] == [not refused_on_one, True]
    for step in range(3):
        for plans in ranks:
            plans.fix()
        votes = sum(h.restart_vote(step) for h in handlers)  # the step's count
        for h in handlers:
            h.restart_counted(step, votes)
        for plans in ranks:
            plans.began()
    assert [h.restart_due(2) for h in handlers] == [not refused_on_one] * 2


def test_adjust_batch_acks_the_applied_step_and_refuses_other_jobs_and_stale_plans() -> None:
    plans = registered()
    h = handler(plans)
    plans.fix()
    ack = command(h, AdjustBatch(action_id="a1", job="j", plan=plan(1, 0, (3, 5))))
    assert (ack.ok, ack.applied_step, ack.plan_version) == (True, 1, 1)
    with pytest.raises(Rejected) as stale:
        command(h, AdjustBatch(action_id="a2", job="j", plan=plan(0, 0)))
    assert stale.value.code == "stale"
    other = plan(2, 0).model_copy(update={"job": "k"})
    with pytest.raises(Rejected) as foreign:
        command(h, AdjustBatch(action_id="a3", job="k", plan=other))
    assert foreign.value.code == "bad_request"
