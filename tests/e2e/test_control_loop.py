"""The whole control loop: real nats-server, etcd, the three services, 4 torch gloo ranks.

Rank 3 turns 3x slower at step 15 under policy lb-bsp. The monitor must flag it, the
controller must write a plan that every rank applies at the same step, balance efficiency
must recover, and every sample of every epoch must reach the model exactly once."""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict

import pytest

from antdt.schemas import ActionResult, JobHealth
from tests.e2e.conftest import BATCH, DATASET, EPOCHS, ONSET, WORLD, StragglerRun

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.integration]


async def test_straggler_detected_plan_applied_and_samples_exactly_once(
    straggler_run: StragglerRun,
) -> None:
    run = straggler_run  # the job runs once per session (tests/e2e/conftest.py)
    assert run.rc == 0
    steps, health, incidents, actions = run.steps, run.health, run.incidents, run.actions

    # 1. the slowed rank was detected
    slow = [i for i in incidents if i.rank == 3 and i.kind.value == "slow"]
    assert slow, f"no slow incident for rank 3: {incidents}"
    assert min(i.step for i in slow) >= ONSET

    # 2. new plans were applied by every rank, each at the same step on every rank
    applied = [a for a in actions if a.result == ActionResult.APPLIED]
    assert applied, f"no applied action: {actions}"
    for action in applied:
        assert action.local_batch is not None and sum(action.local_batch) == BATCH
        assert action.acked_ranks == (0, 1, 2, 3)
        for rank in range(WORLD):
            if max(e.step for e in steps[rank]) < action.effective_step:
                continue  # a late re-plan whose step the run never reached: nothing to switch
            switch = [e.step for e in steps[rank] if e.plan_version == action.plan_version]
            assert switch and min(switch) == action.effective_step, (rank, switch[:3])
    # the answer to the detected straggler (on 2 shared cores a measured leader may have
    # been rebalanced before the onset already)
    # the straggler is the rank relieved (other ranks share 2 cores with this test's
    # servers, so their batches differ somewhat too)
    answers = [
        a
        for a in applied
        if (a.effective_step or 0) > ONSET
        and a.local_batch is not None
        and a.local_batch[3] < 0.6 * min(a.local_batch[:3])
    ]
    assert answers, actions
    plan = answers[0]

    # 3. efficiency fell at onset and recovered after the switch. A health report
    # repeats its ranks' latest closed windows until one closes, so each window counts
    # once (a stalled stretch of repeats would otherwise outvote the windows around it);
    # medians, because a window holding an uneven epoch-tail step dips on its own.
    series = _per_window(health)
    before = [e for s, e in series if s < ONSET]
    dip = [e for s, e in series if ONSET <= s <= plan.effective_step + 8]
    after = [e for s, e in series if s >= plan.effective_step + 8]
    assert before and dip and after, series
    # The slowdown shows against this run's healthy windows. Not an absolute 0.7: while
    # the slowed rank sleeps, the others get its share of the 2 cores, so the dip is
    # shallower the busier the machine (CI saw 0.72, from 0.94 before the onset).
    assert min(dip) <= statistics.median(before) - 0.1, series
    # The recovery is judged against what no mitigation gives: about 0.45 in the demo's
    # `none` run, 0.40 by the step-time model for one rank 3x slower among four; with a
    # plan the median after it was 0.63 to 0.84 here and in CI. Not against the dip:
    # the faster the plan, the fewer slowed windows there are to measure one in (CI once
    # saw a dip of 0.77, in one window, and 0.77 after the plan), nor against the
    # healthy level, which the same spread of the 2 shared cores moves by as much.
    assert statistics.median(after) >= 0.55, series

    # 4. every sample of every epoch reached the model exactly once
    per_epoch: dict[int, Counter[int]] = defaultdict(Counter)
    for rank in range(WORLD):
        for line in (run.out / f"samples.rank{rank}.jsonl").read_text().splitlines():
            record = json.loads(line)
            per_epoch[record["epoch"]].update(record["ids"])
    assert sorted(per_epoch) == list(range(EPOCHS))
    for epoch, counts in per_epoch.items():
        assert set(counts) == set(range(DATASET)), f"epoch {epoch} lost samples"
        assert max(counts.values()) == 1, f"epoch {epoch} repeated samples"


def _per_window(health: list[JobHealth]) -> list[tuple[int, float]]:
    """(step, balance efficiency) once per closed window: a report whose figures equal
    the previous report's repeats the same windows."""
    series: list[tuple[int, float]] = []
    last: tuple[float, float] | None = None
    for report in health:
        if not report.ranks:
            continue
        figures = (report.balance_efficiency, report.step_s)
        if figures != last:
            series.append((report.step, report.balance_efficiency))
        last = figures
    return series
