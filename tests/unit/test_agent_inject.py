"""ANTDT_INJECT parsing and the slowdown schedule (pure)."""

from __future__ import annotations

import pytest

from antdt.agent.inject import Injection, InjectionSchedule, parse_inject


def test_parse_rank_and_host_entries() -> None:
    schedule = parse_inject("rank=3,factor=3,from=30; host=slot1,factor=2,from=0,until=50;")
    assert schedule.entries == (
        Injection(factor=3.0, rank=3, start=30),
        Injection(factor=2.0, host="slot1", start=0, until=50),
    )


def test_empty_schedule_is_falsy_and_slows_nothing() -> None:
    schedule = parse_inject("  ")
    assert not schedule
    assert schedule.factor(0, "h", 10) == 1.0
    assert schedule.extra_sleep(0, "h", 10, 0.5) == 0.0


@pytest.mark.parametrize(
    ("rank", "host", "step", "factor"),
    [
        (3, "a", 29, 1.0),
        (3, "a", 30, 3.0),
        (3, "a", 10_000, 3.0),
        (2, "slot1", 0, 2.0),
        (2, "slot1", 49, 2.0),
        (2, "slot1", 50, 1.0),
        (3, "slot1", 40, 3.0),  # both match: the larger factor wins
        (0, "slot0", 40, 1.0),
    ],
)
def test_factor_by_rank_host_and_step(rank: int, host: str, step: int, factor: float) -> None:
    schedule = parse_inject("rank=3,factor=3,from=30;host=slot1,factor=2,until=50")
    assert schedule.factor(rank, host, step) == factor


def test_extra_sleep_makes_compute_factor_times_longer() -> None:
    schedule = parse_inject("rank=0,factor=2.5")
    assert schedule.extra_sleep(0, "h", 0, 0.2) == pytest.approx(0.3)
    assert schedule.extra_sleep(0, "h", 0, -1.0) == 0.0


def test_for_rank_keeps_only_entries_for_this_rank() -> None:
    schedule = parse_inject("rank=1,factor=2;host=x,factor=3;rank=0,factor=4")
    mine = schedule.for_rank(0, "x")
    assert [e.factor for e in mine.entries] == [3.0, 4.0]
    assert isinstance(mine, InjectionSchedule)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rank=1", "factor= is required"),
        ("factor=2", "exactly one of rank= or host="),
        ("rank=1,host=a,factor=2", "exactly one of rank= or host="),
        ("rank=1,factor=0.5", "factor must be a finite number >= 1"),
        ("rank=1,factor=nan", "factor must be a finite number >= 1"),
        ("rank=1,factor=fast", "factor='fast' is not a number"),
        ("rank=x,factor=2", "rank='x' is not an integer"),
        ("rank=-1,factor=2", "rank must be >= 0"),
        ("rank=1,factor=2,from=10,until=10", "until (10) must be after from (10)"),
        ("rank=1,factor=2,speed=3", "unknown key 'speed'"),
        ("rank=1,factor=2,rank=2", "rank given twice"),
        ("rank=1,factor", "'factor' is not key=value"),
        ("rank=1,,factor=2", "'' is not key=value"),
    ],
)
def test_malformed_schedules_are_refused_clearly(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_inject(text)
    assert message in str(err.value)
    assert "inject entry" in str(err.value)
