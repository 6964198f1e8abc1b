"""A rank whose link is slow (an open SLOW incident, cause communication): no policy cuts
its batch, antdt-nd moves its node when the saving pays for the restart and records why
not when it does not. Compute stragglers keep getting ADJUST_BS first."""

from __future__ import annotations

from typing import Any

import pytest

from antdt.schemas import (
    Cause,
    Incident,
    IncidentKind,
    IncidentState,
    RestartLedger,
    StragglerClass,
)
from antdt.services.controller.actions import RestartDeclined
from antdt.services.controller.policies import (
    AdjustBatchAction,
    KillRestartAction,
    LbBspPolicy,
)
from antdt.services.controller.policies.links import LinkMove, estimate_move
from tests.unit.test_policies import FAST, JOB, incident
from tests.unit.test_policy_nd import decide, nd_view

EVEN = (FAST, FAST, FAST, FAST)
# health.step_s is 100 ms now; 34 ms before the onset: 66 ms per step lost to the link.
STEP_NOW, STEP_BEFORE = 0.1, 0.034
STEPS_LONG = 15_625  # 2,000,000 samples left at 128 per step


def link(
    rank: int = 2,
    cls: StragglerClass = StragglerClass.PERSISTENT,
    state: IncidentState = IncidentState.ESCALATED,
    **evidence: float,
) -> Incident:
    figures = {"link_rtt_s": 0.080, "others_link_rtt_s": 0.001, "step_s_before": STEP_BEFORE}
    figures.update(evidence)
    return Incident(
        id=f"{JOB}-r{rank}-slow-7",
        job=JOB,
        rank=rank,
        host=f"h{rank}",
        kind=IncidentKind.SLOW,
        straggler_class=cls,
        cause=Cause.COMMUNICATION,
        state=state,
        step=90,
        opened_at=900.0,
        updated_at=950.0,
        ratio=1.0,
        windows=4,
        evidence=figures,
    )


def link_view(incidents: tuple[Incident, ...] | None = None, **kwargs: Any):
    return nd_view(speeds=EVEN, incidents=(link(),) if incidents is None else incidents, **kwargs)


def test_the_saving_is_the_step_time_lost_since_the_onset_times_the_steps_left() -> None:
    move = estimate_move(link_view(), link())
    assert move == LinkMove(STEP_NOW, STEP_BEFORE, STEPS_LONG)
    assert move.saving_s == pytest.approx(0.066 * STEPS_LONG)
    assert estimate_move(link_view(remaining=None), link()) is None
    no_onset = link()
    del no_onset.evidence["step_s_before"]
    assert estimate_move(link_view(), no_onset) is None


def test_a_slow_link_that_pays_moves_the_node_and_keeps_the_batches() -> None:
    v = link_view()
    [action] = decide(v, link())
    assert isinstance(action, KillRestartAction)
    assert (action.action_id, action.rank, action.host) == (f"{JOB}-restart-1", 2, "h2")
    assert action.incident_id == link().id and action.local_batch_after is None
    assert action.expected_saving_s == pytest.approx(0.066 * STEPS_LONG)
    assert "its link is slow (round trip 80.0 ms, the other ranks' 1.0 ms)" in action.reason
    assert "100.0 ms now, 34.0 ms before the onset" in action.reason
    # A health tick decides the same, for a link slow from the rank's start too.
    assert decide(v) == [action]
    deterministic = link_view(incidents=(link(cls=StragglerClass.DETERMINISTIC),))
    assert [type(a) for a in decide(deterministic)] == [KillRestartAction]


@pytest.mark.parametrize(
    ("case", "kwargs", "why"),
    [
        ("short run", {"remaining": 128 * 500}, "it does not pay: saving 33.0s over 500 steps"),
        ("no spare", {"params": {"host_pool": "h0,h1,h2,h3"}}, "no free spare node to move it to"),
        (
            "budget used",
            {"restarts": RestartLedger(count=2, last_decided_at=0.0)},
            "restart budget used (2 of 2)",
        ),
        ("unknown length", {"remaining": None}, "the steps left are unknown"),
    ],
)
def test_a_move_that_does_not_happen_is_declined_with_its_reason(
    case: str, kwargs: dict[str, Any], why: str
) -> None:
    v = link_view(**kwargs)
    [declined] = decide(v, link())
    assert isinstance(declined, RestartDeclined), case
    assert (declined.rank, declined.host, declined.incident_id) == (2, "h2", link().id)
    assert declined.action_id == f"{link().id}-declined-escalated"
    assert why in declined.reason and "rank 2 on h2: its link is slow" in declined.reason
    assert decide(v) == []  # a health tick records nothing: once per transition


def test_a_link_not_known_to_last_is_neither_moved_nor_resized() -> None:
    for cls in (StragglerClass.UNKNOWN, StragglerClass.TRANSIENT):
        incident = link(cls=cls, state=IncidentState.OPENED)
        v = link_view(incidents=(incident,))
        assert decide(v, incident) == [] and decide(v) == []


def test_no_plan_cuts_a_link_bound_rank_whose_steps_look_slow() -> None:
    # Rank 2's measured speed is a third of the others' (its long steps), rank 3 is a
    # compute straggler at the same speed: only rank 3's batch is cut, rank 2 keeps 32.
    speeds = (FAST, FAST, FAST / 3, FAST / 3)
    v = nd_view(speeds=speeds, incidents=(link(cls=StragglerClass.UNKNOWN), incident()))
    for actions in (decide(v), LbBspPolicy().decide(v, v.health)):  # type: ignore[arg-type]
        [adjust] = actions
        assert isinstance(adjust, AdjustBatchAction)
        assert adjust.local_batch[2] == 32 and adjust.local_batch[3] < 32
        assert sum(adjust.local_batch) == 128
    alone = nd_view(speeds=speeds, incidents=(link(cls=StragglerClass.UNKNOWN),))
    assert decide(alone) == [] and LbBspPolicy().decide(alone, link()) == []


def test_a_compute_straggler_still_gets_adjust_bs_first() -> None:
    v = nd_view(batch=None, incidents=(incident(),))
    assert [type(a) for a in decide(v)] == [AdjustBatchAction]
