"""`antdt status`, the pure part: the state object and its rendering (rich capture)."""

from __future__ import annotations

import re

from rich.console import Console

from antdt.observe.status import StatusState, render, sparkline
from antdt.schemas import IncidentState, Plan, RankColumns, RankState
from tests.unit.test_observe_timeline import JOB, T0, synthetic_run


def _text(state: StatusState, now: float = T0 + 10) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(render(state, now))
    return console.export_text()


def _row(text: str, first: str) -> list[str]:
    """The cells of the first table row whose first cell is `first` (cells are separated
    by two or more spaces; an empty cell shows as a wider gap)."""
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{text}")


def _plan(version: int, batch: tuple[int, ...]) -> Plan:
    return Plan(
        job=JOB,
        version=version,
        local_batch=batch,
        effective_step=35,
        reason="rebalance",
        policy="lb-bsp",
        created_at=T0,
    )


def _state() -> StatusState:
    run = synthetic_run()
    state = StatusState(job=JOB)
    slow = (
        run.health[-1]
        .ranks[0]
        .model_copy(
            update={
                "rank": 3,
                "host": "h3",
                "state": RankState.SLOW,
                "ratio": 3.0,
                "samples_per_s": 333.0,
                "compute_s_per_sample": 0.003,
            }
        )
    )
    for health in run.health:
        state.apply_health(
            health.model_copy(update={"ranks": RankColumns.of_rows((health.ranks[0], slow))})
        )
    for incident in run.incidents:
        state.apply_incident(incident)
    for action in run.actions:
        state.apply_action(action)
    state.apply_plan(_plan(1, (72, 72, 72, 40)))
    return state


def test_render_shows_the_straggler_its_class_and_the_action() -> None:
    text = _text(_state())
    assert _row(text, "3") == [
        "3",
        "h3",
        "slow",
        "slow/persistent",
        "333",
        "3.000",
        "3.00",
        "40",
        "0%",
        "10%",
        "-",  # helped nobody
    ]
    assert _row(text, "0")[:4] == ["0", "h0", "ok", "1,000"]  # no class
    assert "plan v1 (lb-bsp) from step 35: local batch [72, 72, 72, 40] = 256" in text
    assert "job-a-r3-slow-1" in text and "escalated" in text  # open incident
    assert "act-1" in text and "applied" in text and "[72, 72, 72, 40]" in text
    assert "act-0" in text and "refused" in text
    assert "efficiency 0.90" in text and "step 55" in text


def test_render_shows_whose_samples_a_rank_computed_under_work_sharing() -> None:
    state = _state()
    assert state.health is not None
    helper = state.health.ranks[0].model_copy(update={"helped": {3: 240, 1: 8}})
    state.apply_health(
        state.health.model_copy(
            update={"ranks": RankColumns.of_rows((helper, state.health.ranks[1]))}
        )
    )
    assert _row(_text(state), "0")[-2:] == ["10%", "r1:8 r3:240"]


def test_resolved_incidents_leave_the_open_list_and_the_class_column() -> None:
    state = _state()
    last = max(state.incidents.values(), key=lambda i: i.updated_at)
    state.apply_incident(
        last.model_copy(update={"state": IncidentState.RESOLVED, "updated_at": T0 + 9})
    )
    assert state.open_incidents() == [] and state.rank_class(3) == ""
    assert "open incidents: none" in _text(state)


def test_older_or_foreign_messages_do_not_override() -> None:
    state = _state()
    newest = state.health
    assert newest is not None
    state.apply_health(newest.model_copy(update={"at": newest.at - 1, "step": 1}))
    state.apply_health(newest.model_copy(update={"job": "other", "step": 999}))
    state.apply_plan(_plan(0, (64, 64, 64, 64)))
    assert state.health is newest and state.plan is not None and state.plan.version == 1
    held = state.incidents["job-a-r3-slow-1"]
    state.apply_incident(held.model_copy(update={"updated_at": T0, "state": IncidentState.OPENED}))
    assert state.incidents["job-a-r3-slow-1"] is held


def test_recent_actions_are_bounded_and_in_decision_order() -> None:
    state = _state()
    state.recent = 1
    assert [a.action_id for a in state.recent_actions()] == ["act-1"]
    assert "act-0" not in _text(state)


def test_empty_state_says_what_is_missing() -> None:
    text = _text(StatusState(job="fresh", notes=["plan unavailable: no responder"]))
    assert "no JobHealth yet" in text and "plan: unknown" in text
    assert "open incidents: none" in text and "recent actions: none" in text
    assert "plan unavailable: no responder" in text


def test_sparkline_scales_zero_to_one() -> None:
    assert sparkline([0.0, 0.5, 1.0, 2.0, -1.0]) == "▁▅█ █▁".replace(" ", "")


def test_a_large_job_shows_its_ranks_not_ok_and_its_slowest_and_counts_the_rest() -> None:
    state = _state()
    assert state.health is not None
    ok = state.health.ranks[0]
    ranks = tuple(
        ok.model_copy(update={"rank": r, "host": f"h{r}", "ratio": 1.0 + r / 100_000})
        for r in range(2_000)
    )
    slow = ranks[3].model_copy(update={"state": RankState.SLOW, "ratio": 0.5})
    ranks = (*ranks[:3], slow, *ranks[4:])
    state.apply_health(state.health.model_copy(update={"ranks": RankColumns.of_rows(ranks)}))
    state.apply_plan(_plan(2, (2,) * 1_999 + (1,)))
    text = _text(state)
    shown = [line.split()[0] for line in text.splitlines() if re.match(r"\s*\d+\s+h\d+\s", line)]
    # the slow rank despite its low ratio, then the 39 highest ratios, by rank
    assert shown == ["3", *map(str, range(1_961, 2_000))]
    assert "1,960 of 2,000 ranks not shown" in text and "max 1.02" in text
    assert "local batch 1-2 over 2,000 ranks = 3999" in text
