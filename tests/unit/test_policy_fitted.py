"""The ranks' fitted models read as arrays (policies/fitted.py) are what the row-by-row
reading they replaced gives, to the bit: models missing, held ranks, data-bound ranks,
rows out of order or unusable, ties and zeros of either sign at the median."""

from __future__ import annotations

import random
import statistics
from collections.abc import Set as AbstractSet

import numpy as np
import pytest

from antdt.schemas import (
    Cause,
    Incident,
    IncidentKind,
    IncidentState,
    JobHealth,
    JobSpec,
    Plan,
    RankHealth,
    RankState,
)
from antdt.services.controller.balance import StepModel
from antdt.services.controller.policies import JobView
from antdt.services.controller.policies.fitted import median
from antdt.services.controller.policies.judged import (
    _fitted,
    _table,
    _usable,
    data_per_sample,
)

JOB = "fitted"
#: Few values, so that ties (and zeros of both signs) reach the median.
FIXED = (None, 0.0, -0.0, 0.002, 0.002, 0.004, 0.01)
PER_SAMPLE = (None, 0.0, 0.001, 0.001, 0.0015, 0.003)
RATES = (0.0, 500.0, 1000.0, 1000.0)
STATES = (RankState.OK,) * 6 + (RankState.SLOW, RankState.LEADER, RankState.STALLED)


def reference_fitted(
    view: JobView, held: AbstractSet[int]
) -> tuple[dict[int, StepModel], StepModel | None]:
    """`_fitted` as it read the rows one by one (before the arrays)."""
    data = data_per_sample(view)
    own: dict[int, StepModel] = {}
    normal: tuple[list[float], list[float]] = ([], [])
    table = _table(view)
    for i in _usable(view):
        fixed, per_sample, rank = table.fixed_s[i], table.per_sample_s[i], table.rank[i]
        if fixed is None or per_sample is None or not per_sample > 0 < table.samples_per_s[i]:
            continue
        if data:
            per_sample += data.get(rank, 0.0)
        if rank in held:
            own[rank] = StepModel(fixed, per_sample)
        else:
            normal[0].append(fixed)
            normal[1].append(per_sample)
    if not normal[0]:
        return own, None
    return own, StepModel(statistics.median(normal[0]), statistics.median(normal[1]))


def _row(rnd: random.Random, rank: int) -> RankHealth:
    return RankHealth(
        rank=rank,
        host=f"h{rank}",
        state=rnd.choice(STATES),
        last_step=100,
        local_batch=rnd.choice((0, 16, 32)),
        samples_per_s=rnd.choice(RATES),
        compute_s_per_sample=1e-3,
        ratio=1.0,
        data_wait_share=rnd.choice((0.0, 0.0, 0.1, 0.35)),
        comm_share=0.1,
        fixed_s=rnd.choice(FIXED),
        per_sample_s=rnd.choice(PER_SAMPLE),
    )


def _data_bound(rank: int, n: int) -> Incident:
    return Incident(
        id=f"{JOB}-r{rank}-{n}",
        job=JOB,
        rank=rank,
        host=f"h{rank}",
        kind=IncidentKind.SLOW,
        cause=Cause.DATA,
        state=IncidentState.OPENED,
        step=90,
        opened_at=900.0,
        updated_at=900.0,
        ratio=2.0,
        windows=1,
    )


def drawn_view(seed: int) -> tuple[JobView, set[int]]:
    """A job of a few to a few hundred ranks, its rows in order or not, some missing
    or beyond the job, some data-bound; and a drawn set of held ranks."""
    rnd = random.Random(seed)
    n = rnd.choice((1, 2, 3, 7, 40, 301))
    world = n + rnd.choice((0, 0, 0, 2, -1)) if n > 1 else n
    ranks = list(range(n))
    if rnd.random() < 0.3:
        rnd.shuffle(ranks)
    rows = tuple(_row(rnd, r) for r in ranks)
    spec = JobSpec(
        job=JOB,
        world_size=world,
        dataset_size=100_000,
        shard_size=32,
        global_batch=32 * world,
        policy="lb-bsp",
    )
    health = JobHealth(
        job=JOB,
        at=500.0,
        step=100,
        step_s=0.1,
        samples_per_s=1000.0,
        balance_efficiency=0.5,
        plan_version=0,
        ranks=rows,
    )
    bound = rnd.sample(range(n), rnd.randint(0, min(n, 5))) if rnd.random() < 0.4 else []
    view = JobView(
        spec=spec,
        plan=Plan(
            job=JOB, version=0, local_batch=spec.equal_shares(), effective_step=0, created_at=0.0
        ),
        health=health,
        open_incidents=tuple(_data_bound(r, i) for i, r in enumerate(bound)),
        memory_caps={},
        last_action_at=None,
        now=1000.0,
    )
    held = set(rnd.sample(range(n), rnd.randint(0, n))) if rnd.random() < 0.7 else set()
    if rnd.random() < 0.2:
        held |= {-1, world + 3}  # outside the job: read as no rank
    return view, held


@pytest.mark.parametrize("seed", range(300))
def test_models_read_as_arrays_are_the_row_by_row_ones(seed: int) -> None:
    view, held = drawn_view(seed)
    assert repr(_fitted(view, held)) == repr(reference_fitted(view, held))


def test_the_drawn_views_reach_every_path() -> None:
    """The draws above meet what they are for: the array path, data-bound ranks, held
    ranks with a model, and a zero at the median."""
    seen = {"arrays": 0, "data": 0, "own": 0, "zero median": 0}
    for seed in range(300):
        view, held = drawn_view(seed)
        columns = view.health_columns
        seen["arrays"] += not (columns.complete and columns.all_fitted)
        seen["data"] += bool(data_per_sample(view))
        own, typical = reference_fitted(view, held)
        seen["own"] += bool(own)
        seen["zero median"] += typical is not None and typical.fixed_s == 0.0
    assert min(seen.values()) >= 10, seen


@pytest.mark.parametrize("seed", range(200))
def test_median_is_statistics_median_to_the_bit(seed: int) -> None:
    rnd = random.Random(seed)
    pool = rnd.choice(((0.0, -0.0), (0.0, -0.0, 1.5, -2.0), (0.1, 0.2, 0.30000000000000004)))
    values = [rnd.choice(pool) for _ in range(rnd.randint(1, 30))]
    if rnd.random() < 0.5:
        values = [rnd.uniform(-1, 1) for _ in values]
    assert repr(median(np.array(values))) == repr(statistics.median(values))
