"""A data-bound rank (an open SLOW incident, cause data) is planned on its time before the
barrier: its compute plus its data wait per sample, which grows with its batch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from antdt.schemas import Cause, JobHealth, RankColumns
from antdt.services.controller.policies import AdjustBatchAction, load_policy
from antdt.services.controller.policies.judged import data_per_sample, measured_speeds
from antdt.services.controller.view import JobView
from tests.unit.test_policies import incident, view

EVEN = (1000.0, 1000.0, 1000.0, 1000.0)


def data_bound(share: float, cause: Cause = Cause.DATA) -> JobView:
    """Four ranks equally fast at compute (1 ms a sample, 32 a step, steps of 0.1 s);
    rank 3 waits `share` of its step for data."""
    v = view(EVEN, incidents=(incident().model_copy(update={"cause": cause}),))
    assert v.health is not None
    rows = tuple(
        r.model_copy(update={"data_wait_share": share}) if r.rank == 3 else r
        for r in v.health.ranks
    )
    health: JobHealth = v.health.model_copy(update={"ranks": RankColumns.of_rows(rows)})
    return replace(v, health=health)


def test_data_wait_per_sample_of_a_data_bound_rank_only() -> None:
    # 0.6 x 0.1 s a step over 32 samples: 1.875 ms a sample on top of 1 ms of compute.
    assert data_per_sample(data_bound(0.6)) == pytest.approx({3: 0.6 * 0.1 / 32})
    speeds = measured_speeds(data_bound(0.6))
    assert speeds[:3] == (1000.0, 1000.0, 1000.0)
    assert speeds[3] == pytest.approx(1 / (0.001 + 0.6 * 0.1 / 32))
    # A compute incident's data wait is not the rank's own work: nothing added.
    assert data_per_sample(data_bound(0.6, Cause.COMPUTE)) == {}


def test_lb_bsp_cuts_the_data_bound_ranks_batch() -> None:
    v = data_bound(0.6)
    assert v.health is not None
    [action] = load_policy("lb-bsp").decide(v, v.health)
    assert isinstance(action, AdjustBatchAction)
    assert action.local_batch[3] < 32 < min(action.local_batch[:3])
