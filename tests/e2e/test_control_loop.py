"""The whole control loop: real nats-server, etcd, the three services, 2 torch gloo ranks
pinned one per core.

From step 15 a noisy neighbour (busy loops pinned to rank 1's core) really slows rank 1,
under policy lb-bsp; nothing sleeps. The monitor must flag it, the controller must write
a plan that every rank applies at the same step, balance efficiency must recover, and
every sample of every epoch must reach the model exactly once."""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict

import pytest

from antdt.schemas import ActionResult, JobHealth
from tests.e2e.conftest import (
    BATCH,
    DATASET,
    EPOCHS,
    ONSET,
    STRAGGLER,
    WORLD,
    StragglerRun,
    neighbour_slowdown,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.integration]

#: The least the neighbour must slow its rank against the other for the test to mean
#: anything (the issue's detector must see 1.4x; it was 2.1-2.3x here, load average 3-7).
SLOWED = 1.5


async def test_straggler_detected_plan_applied_and_samples_exactly_once(
    straggler_run: StragglerRun,
) -> None:
    assert_mitigated(straggler_run)  # the job runs once per session (tests/e2e/conftest.py)


def assert_mitigated(run: StragglerRun) -> None:
    """The straggler `run` made was detected, a plan relieving it applied by every rank
    at one step, efficiency recovered, and every sample reached the model exactly once."""
    assert run.rc == 0
    steps, health, incidents, actions = run.steps, run.health, run.incidents, run.actions
    applied = [a for a in actions if a.result == ActionResult.APPLIED]

    # 0. the neighbour made a straggler: measured up to the first plan after the onset
    replanned = [a.effective_step or 0 for a in applied if (a.effective_step or 0) > ONSET + 3]
    slowdown = neighbour_slowdown(run, min([*replanned, ONSET + 12]))
    assert slowdown >= SLOWED, (
        f"the neighbour slowed rank {STRAGGLER} x{slowdown:.2f} only against the other rank: "
        "no straggler to detect (outside the foreground, without CAP_SYS_NICE, a busy machine "
        "moves its other work onto the other rank's core)"
    )

    # 1. the slowed rank was detected
    slow = [i for i in incidents if i.rank == STRAGGLER and i.kind.value == "slow"]
    assert slow, f"no slow incident for rank {STRAGGLER}: {incidents}"
    assert min(i.step for i in slow) >= ONSET

    # 2. new plans were applied by every rank, each at the same step on every rank
    assert applied, f"no applied action: {actions}"
    for action in applied:
        assert action.local_batch is not None and sum(action.local_batch) == BATCH
        assert action.acked_ranks == tuple(range(WORLD))
        for rank in range(WORLD):
            if max(e.step for e in steps[rank]) < action.effective_step:
                continue  # a late re-plan whose step the run never reached: nothing to switch
            switch = [e.step for e in steps[rank] if e.plan_version == action.plan_version]
            assert switch and min(switch) == action.effective_step, (rank, switch[:3])
    # the answer to the detected straggler: the rank relieved
    answers = [
        a
        for a in applied
        if (a.effective_step or 0) > ONSET
        and a.local_batch is not None
        and a.local_batch[STRAGGLER] < 0.6 * min(a.local_batch[:STRAGGLER])
    ]
    assert answers, actions
    plan = answers[0]

    # 3. efficiency fell at onset and recovered after the switch. A health report
    # repeats its ranks' latest closed windows until one closes, so each window counts
    # once (a stalled stretch of repeats would otherwise outvote the windows around it);
    # medians, because a window holding an uneven epoch-tail step dips on its own.
    # A report at step ONSET counts before: its window holds one slowed step at most
    # (a slow machine's first judged window may end there, leaving none earlier).
    series, switched = _per_window(health), plan.effective_step or 0
    before = [e for s, e in series if s <= ONSET]
    dip = [e for s, e in series if ONSET < s <= switched + 8]
    after = [e for s, e in series if s >= switched + 8]
    assert before and dip and after, series
    # The slowdown shows against this run's healthy windows (0.65-0.68 from 0.96-1.0 here
    # at load averages 3-7: the ranks and the services run in the foreground).
    assert min(dip) <= statistics.median(before) - 0.1, series
    # The recovery is judged against what no mitigation gives: with one rank of two s
    # times slower per sample (the measured slowdown), about 2 / (s + 1), as the dip
    # shows; the plan must win back at least half of what the straggler cost (0.89-0.95
    # after it here). Not against the dip alone: the faster the plan, the fewer slowed
    # windows there are to measure one in.
    unmitigated = 2 / (slowdown + 1)
    assert statistics.median(after) >= (1 + unmitigated) / 2, (slowdown, series)

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
