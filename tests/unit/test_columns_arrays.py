"""A health's columns (controller/columns.py) with its speeds read as an array are
what the per-rank reading they replaced gives, to the bit, on drawn healths: rates of
zero, models missing or flat, rows unusable, out of order, missing or beyond the job."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest

from antdt.schemas import JobHealth, RankState
from antdt.services.controller.columns import HealthColumns
from tests.unit.test_policy_fitted import drawn_view

_USABLE = frozenset((RankState.OK, RankState.SLOW, RankState.LEADER))


def reference_columns(health: JobHealth, world_size: int) -> dict[str, Any]:
    """HealthColumns.of's fields as the per-rank reading made them."""
    table = health.ranks
    ranks = list(table.rank)
    hosts = dict(zip(ranks, table.host, strict=True))
    states = set(table.state)
    away = not states.isdisjoint((RankState.EXITED, RankState.RESTARTING))
    fields: dict[str, Any] = {"ranks": ranks, "hosts": hosts, "away": away}
    if not states <= _USABLE or ranks != list(range(world_size)):
        return {**fields, "complete": False}
    rates, fixed, per_sample = (
        list(c) for c in (table.samples_per_s, table.fixed_s, table.per_sample_s)
    )
    fitted = None not in fixed and None not in per_sample
    speeds = tuple(1.0 / (1.0 / rate) if rate > 0 else None for rate in rates)
    return {
        **fields,
        "complete": True,
        "rates": rates,
        "speeds": speeds,
        "sorted_speeds": None if None in speeds else _ascending(speeds),
        "fixed": fixed,
        "per_sample": per_sample,
        "all_fitted": fitted
        and min(cast(list[float], per_sample), default=1.0) > 0
        and min(rates, default=1.0) > 0,
        "sorted_fixed": _ascending(fixed) if fitted else None,
        "sorted_per_sample": _ascending(per_sample) if fitted else None,
    }


def _ascending(values: Any) -> list[float]:
    """As the columns sorted them (numpy's sort: -0.0 and 0.0 in either order)."""
    return cast(list[float], np.sort(np.array(values, dtype=np.float64)).tolist())


def _read(columns: HealthColumns, names: list[str]) -> dict[str, Any]:
    values = {name: getattr(columns, name) for name in names}
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in values.items()}


@pytest.mark.parametrize("seed", range(300))
def test_columns_are_the_per_rank_reading(seed: int) -> None:
    view, _ = drawn_view(seed)
    assert view.health is not None
    for health in (view.health, _every_rank_fast(view.health)):
        expected = reference_columns(health, view.spec.world_size)
        got = _read(HealthColumns.of(health, view.spec.world_size), list(expected))
        assert repr(got) == repr(expected)


def _every_rank_fast(health: JobHealth) -> JobHealth:
    """`health` with each rank's speed positive (the usual job: every speed known), some
    of them not their own 1 / (1 / rate)."""
    rates = tuple(rate or 1.8 for rate in health.ranks.samples_per_s)
    return health.model_copy(
        update={"ranks": health.ranks.model_copy(update={"samples_per_s": rates})}
    )
