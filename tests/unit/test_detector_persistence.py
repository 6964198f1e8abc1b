"""Persistence counts deviating windows in a row: bursts with a normal pace between them,
or a noisy stretch before one, never add up to a persistent straggler."""

from __future__ import annotations

from collections.abc import Callable

from antdt.schemas import IncidentState, StragglerClass
from antdt.services.monitor import DetectorConfig
from tests.unit.test_detector import Job, run

K, W = DetectorConfig().persistent_windows, DetectorConfig().window


def rank3(pattern: Callable[[int], float]) -> Callable[[int, int], float]:
    """Per-sample cost 1 ms, times `pattern(step)` on rank 3."""
    return lambda rank, step: 0.001 * (pattern(step) if rank == 3 else 1.0)


def bursts(*spans: tuple[int, int], gap: Callable[[int], float] = lambda step: 1.0):
    """3x inside the [from, until) spans, `gap(step)` elsewhere."""
    return lambda step: 3.0 if any(a <= step < b for a, b in spans) else gap(step)


def escalations(transitions) -> list[int]:
    return [i.step for i in transitions if i.state is IncidentState.ESCALATED]


def test_two_bursts_a_normal_window_apart_are_not_persistent() -> None:
    # Two bursts of 2 windows each (< K), one normal window between them: 4 slow
    # windows in 5, never K in a row.
    cost = rank3(bursts((104, 120), (128, 144)))
    _, transitions = run(Job(4, cost=cost), range(220))
    assert escalations(transitions) == []
    assert transitions[-1].state is IncidentState.RESOLVED
    assert transitions[-1].straggler_class is StragglerClass.TRANSIENT


def test_bursts_whose_evidence_lingers_between_them_are_not_persistent() -> None:
    # Between the bursts 5 of each 8 steps are 1.3x: the rank's evidence stays slow
    # (it wears off more slowly than it builds), but its windows look normal (fading):
    # that breaks the slow run as a normal window does.
    noisy = [1.3, 1.0, 1.3, 1.3, 1.0, 1.3, 1.0, 1.3]
    cost = rank3(bursts((104, 120), (136, 152), gap=lambda step: noisy[step % 8]))
    _, transitions = run(Job(4, cost=cost), range(160))
    assert escalations(transitions) == []


def test_a_noisy_stretch_before_a_burst_does_not_count_towards_persistence() -> None:
    # From step 80 rank 3 is 1.25x on 6 steps of 8: its evidence leaves 0 and creeps up,
    # while its windows look normal; a 12-step burst then opens its incident from the
    # evidence, whose run reaches back to step 80. Only windows that looked slow count.
    noisy = [1.25, 1.25, 1.0, 1.25, 1.25, 1.0, 1.25, 1.25]
    stretch = bursts((96, 108), gap=lambda step: noisy[step % 8] if step >= 80 else 1.0)
    _, transitions = run(Job(4, cost=rank3(stretch)), range(200))
    opened = [i for i in transitions if i.state is IncidentState.OPENED]
    assert [i.rank for i in opened] == [3]
    assert opened[0].evidence["slow_for_steps"] > 2 * W  # the run reaches back
    assert escalations(transitions) == []


def test_a_straggler_slow_for_k_windows_in_a_row_is_persistent() -> None:
    cost = rank3(bursts((104, 104 + (K + 1) * W)))
    _, transitions = run(Job(4, cost=cost), range(220))
    assert len(escalations(transitions)) == 1
    assert transitions[-1].straggler_class is StragglerClass.PERSISTENT
