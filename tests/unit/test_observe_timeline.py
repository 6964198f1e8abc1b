"""The pure part of `antdt report`: recorded messages -> figure model and table rows."""

from __future__ import annotations

import math

import pytest

from antdt.observe.timeline import (
    ACTION_COLOR,
    ACTION_OTHER_COLOR,
    INCIDENT_COLOR,
    MAX_RANK_LINES,
    RESOLVED_COLOR,
    RunRecord,
    build_timeline,
    pick_ranks,
    robust_top,
    step_clock,
)
from antdt.schemas import (
    ActionRecord,
    ActionResult,
    Incident,
    IncidentKind,
    IncidentState,
    JobHealth,
    RankColumns,
    RankHealth,
    RankState,
    StepEvent,
    StragglerClass,
)

JOB = "job-a"
T0 = 1_700_000_000.0


def synthetic_run(
    *, world: int = 4, steps: int = 60, slow: int = 3, onset: int = 20, switch: int = 35
) -> RunRecord:
    """A BSP run: rank `slow` is 3x slower per sample from `onset`; from `switch` a plan
    gives it a third of the others' batch. 0.1 s per step, deterministic."""
    per_sample, equal = 0.001, 64
    relieved = [72, 72, 72, 40] if world == 4 else [equal] * world
    events, t = [], T0
    for step in range(steps):
        batch = relieved if step >= switch else [equal] * world
        compute = [
            b * per_sample * (3.0 if r == slow and step >= onset else 1.0)
            for r, b in enumerate(batch)
        ]
        wall = max(compute) + 0.01
        for r in range(world):
            events.append(
                StepEvent(
                    job=JOB,
                    rank=r,
                    host=f"h{r}",
                    step=step,
                    epoch=0,
                    plan_version=1 if step >= switch else 0,
                    local_batch=batch[r],
                    samples=batch[r],
                    compute_s=compute[r],
                    data_wait_s=0.0,
                    comm_s=wall - compute[r],
                    step_s=wall,
                    started_at=t,
                    ended_at=t + wall,
                )
            )
        t += wall
    return RunRecord(
        job=JOB,
        steps=events,
        health=[
            _health(s, T0 + 0.1 * s, 0.5 if onset <= s < switch else 0.9)
            for s in range(0, steps, 5)
        ],
        incidents=[
            _incident(IncidentState.OPENED, onset + 3, StragglerClass.UNKNOWN, slow),
            _incident(IncidentState.ESCALATED, onset + 9, StragglerClass.PERSISTENT, slow),
            _incident(IncidentState.ESCALATED, onset + 9, StragglerClass.PERSISTENT, slow),
        ],
        actions=[
            _action("act-1", ActionResult.APPLIED, switch, tuple(relieved), T0 + 3.0),
            _action("act-0", ActionResult.REFUSED, None, (1, 1, 1, 1), T0 + 2.55),
        ],
    )


def _health(step: int, at: float, eff: float) -> JobHealth:
    rank = RankHealth(
        rank=0,
        host="h0",
        state=RankState.OK,
        last_step=step,
        local_batch=64,
        samples_per_s=1000.0,
        compute_s_per_sample=0.001,
        ratio=1.0,
        data_wait_share=0.0,
        comm_share=0.1,
    )
    return JobHealth(
        job=JOB,
        at=at,
        step=step,
        step_s=0.1,
        samples_per_s=2000.0,
        balance_efficiency=eff,
        plan_version=0,
        ranks=(rank,),
    )


def _incident(state: IncidentState, step: int, klass: StragglerClass, rank: int) -> Incident:
    return Incident(
        id=f"{JOB}-r{rank}-slow-1",
        job=JOB,
        rank=rank,
        host=f"h{rank}",
        kind=IncidentKind.SLOW,
        straggler_class=klass,
        state=state,
        step=step,
        opened_at=T0 + 2.3,
        updated_at=T0 + 0.1 * step,
        ratio=3.0,
        windows=3,
    )


def _action(
    action_id: str, result: ActionResult, eff: int | None, batch: tuple[int, ...], at: float
) -> ActionRecord:
    return ActionRecord(
        action_id=action_id,
        job=JOB,
        kind="adjust_batch",
        policy="lb-bsp",
        reason="rebalance",
        incident_id=f"{JOB}-r3-slow-1",
        plan_version=1 if eff is not None else None,
        local_batch=batch,
        effective_step=eff,
        decided_at=at,
        completed_at=at + 0.01,
        result=result,
        acked_ranks=(0, 1, 2, 3) if eff is not None else (),
    )


def test_rank_series_show_the_straggler_and_its_relief() -> None:
    timeline = build_timeline(synthetic_run())
    assert [s.label for s in timeline.ranks] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    slow = timeline.ranks[3]
    busy = dict(zip(slow.steps, slow.busy_s, strict=True))
    fast = dict(zip(timeline.ranks[0].steps, timeline.ranks[0].busy_s, strict=True))
    assert busy[10] == pytest.approx(fast[10])  # before onset
    assert busy[25] == pytest.approx(3 * fast[25])  # straggling
    assert busy[50] < 1.7 * fast[50]  # relieved by the smaller batch
    per_sample = dict(zip(slow.steps, slow.per_sample_ms, strict=True))
    assert per_sample[50] == pytest.approx(3.0)  # per-sample time still shows the cause
    assert dict(zip(slow.steps, slow.local_batch, strict=True))[50] == 40
    assert len({s.color for s in timeline.ranks}) == 4
    assert ACTION_COLOR not in {s.color for s in timeline.ranks}


def test_markers_for_incident_states_and_actions() -> None:
    timeline = build_timeline(synthetic_run())
    incidents = [m for m in timeline.markers if m.kind == "incident"]
    assert [(m.step, m.color) for m in incidents] == [(23, INCIDENT_COLOR), (29, INCIDENT_COLOR)]
    assert "r3 slow/persistent escalated" in incidents[1].label
    actions = {m.ref: m for m in timeline.markers if m.kind == "action"}
    assert actions["act-1"].step == 35 and actions["act-1"].color == ACTION_COLOR
    assert actions["act-1"].label == "adjust_batch [72, 72, 72, 40] applied"
    # never applied: placed where it was decided, 2.55 s in: steps 0-19 take 0.074 s,
    # then 0.202 s, so step 24 ends at 2.49 s and step 25 at 2.692 s
    assert actions["act-0"].color == ACTION_OTHER_COLOR
    assert actions["act-0"].step == pytest.approx(24 + 0.06 / 0.202)
    resolved = synthetic_run()
    resolved.incidents.append(
        resolved.incidents[0].model_copy(
            update={"state": IncidentState.RESOLVED, "step": 55, "updated_at": T0 + 5.5}
        )
    )
    colors = [m.color for m in build_timeline(resolved).markers if m.kind == "incident"]
    assert colors[-1] == RESOLVED_COLOR


def test_tables_summary_and_efficiency() -> None:
    timeline = build_timeline(synthetic_run())
    (row,) = timeline.incident_rows
    assert row["path"] == "opened@23 → escalated@29" and row["class"] == "persistent"
    assert [r["action"] for r in timeline.action_rows] == ["act-0", "act-1"]  # by decision time
    assert timeline.action_rows[1]["local batch"] == "72 72 72 40"
    assert timeline.summary["actions applied / recorded"] == "1 / 2"
    assert timeline.summary["steps"] == "0-59" and timeline.summary["ranks"] == "4"
    assert [s for s, _ in timeline.efficiency] == list(range(0, 60, 5))
    walls = dict(timeline.step_wall)
    assert walls[25] == pytest.approx(0.64 * 3 * 0.1 + 0.01)


def test_other_jobs_and_empty_health_rows_are_left_out() -> None:
    run = synthetic_run()
    run.steps.append(run.steps[0].model_copy(update={"job": "other", "step": 999}))
    none = RankColumns.of_rows(())
    run.health.append(run.health[0].model_copy(update={"ranks": none, "step": 999}))
    timeline = build_timeline(run)
    assert max(s for s, _ in timeline.step_wall) == 59
    assert max(s for s, _ in timeline.efficiency) == 55


def test_step_clock_interpolates_and_clamps() -> None:
    clock = step_clock(synthetic_run(steps=10).steps)
    first, last = clock.ends[0], clock.ends[-1]
    assert clock.step_at(first - 5) == 0 and clock.step_at(last + 5) == 9
    mid = (clock.ends[3] + clock.ends[4]) / 2
    assert clock.step_at(mid) == pytest.approx(3.5)
    assert step_clock([]).step_at(T0) == 0.0


def test_large_jobs_draw_flagged_ranks_and_a_median_line() -> None:
    shown, rest = pick_ranks(list(range(64)), {40, 63})
    assert len(shown) == MAX_RANK_LINES - 1 and {40, 63} <= set(shown)
    assert sorted(shown + rest) == list(range(64))
    run = synthetic_run(world=20, slow=17, steps=12, onset=4, switch=100)
    run.incidents = [i.model_copy(update={"rank": 17}) for i in run.incidents]
    series = build_timeline(run).ranks
    assert len(series) == MAX_RANK_LINES and "rank 17" in [s.label for s in series]
    median = series[-1]
    assert median.label == f"median of {20 - (MAX_RANK_LINES - 1)} other ranks"
    assert not any(math.isnan(v) for v in median.per_sample_ms)


def test_robust_top_ignores_a_lone_outlier_only() -> None:
    steady = [1.0 + 0.01 * (i % 7) for i in range(100)]
    assert robust_top(steady) is None  # nothing sticks out: matplotlib's own limits
    top = robust_top([*steady, 50.0])
    assert top is not None and 1.06 < top < 2.0
    assert robust_top([1.0, 50.0]) is None  # too few points to call anything an outlier
    assert robust_top([float("nan")] * 30) is None


def test_a_large_plans_label_is_its_range_and_actions_are_labelled_first() -> None:
    """A 10,000-rank plan's batches made a 40,000-character label across the figure, and
    the figure labels its first MAX_LABELS markers only: incidents used to take them."""
    run = synthetic_run()
    big = _action("act-big", ActionResult.APPLIED, 30, (31,) * 9_999 + (41,), T0 + 4.0)
    run.actions.append(big)
    for n in range(30):  # more incident markers than the figure labels
        run.incidents.append(
            run.incidents[0].model_copy(update={"id": f"{JOB}-r{n}-slow-9", "rank": n % 4})
        )
    markers = build_timeline(run).markers
    labels = {m.ref: m.label for m in markers}
    assert labels["act-big"] == "adjust_batch 31-41 over 10,000 ranks applied"
    assert labels["act-1"].startswith("adjust_batch [")  # four ranks: each batch
    kinds = [m.kind for m in markers]
    assert kinds[: kinds.count("action")] == ["action"] * kinds.count("action")
