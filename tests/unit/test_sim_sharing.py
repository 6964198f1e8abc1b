"""Work sharing in the simulator: the water level against a brute force, the agents' own
offer rule one step late, and the figures of the non-dedicated scenario."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from antdt.sharing import Pace, ShareParams, late_pace_limit, offering, one_piece_scale
from antdt.sim.sharing import (
    SharingModel,
    finish_time,
    late_pace_limit_columns,
    offering_columns,
    one_piece_scale_columns,
)


@settings(max_examples=200, deadline=None)
@given(
    ranks=st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.1, 10.0)), min_size=1, max_size=12),
    pool=st.floats(0.0, 100.0),
)
def test_the_water_level_computes_the_pool_by_then(
    ranks: list[tuple[float, float]], pool: float
) -> None:
    starts = np.array([s for s, _ in ranks])
    rates = np.array([v for _, v in ranks])
    level = finish_time(starts, rates, pool)
    done = float((rates * np.maximum(0.0, level - starts)).sum())
    assert done == pytest.approx(pool, rel=1e-9, abs=1e-9)
    assert level >= (starts.min() if pool > 0 else 0.0)


def _model() -> SharingModel:
    return SharingModel(ShareParams(True, chunks=4), fixed_s=0.0, per_sample_s=0.01)


def test_a_slow_rank_is_shared_from_the_step_after_it_was_seen_slow() -> None:
    model = _model()
    batches = np.full(4, 40.0)
    factors = np.array([1.0, 1.0, 1.0, 3.0])
    own = 0.01 * batches * factors  # 0.4 s, rank 3 1.2 s
    first = model.step(own, batches, factors)
    assert first.compute_s == pytest.approx(1.2) and model.offered == frozenset()
    second = model.step(own, batches, factors)
    assert model.offered == {3}
    # 160 samples at 3 + 1/3 ranks' speed, 100 samples/s each: 0.48 s, plus half a
    # micro-batch (10 samples) at a helper's pace: the owner holds its last one back.
    assert second.compute_s == pytest.approx(0.48 + 0.5 * 0.1)
    assert second.samples.sum() == pytest.approx(160.0)
    assert second.samples[3] == pytest.approx(0.48 * 100 / 3)
    assert second.busy_s[3] == pytest.approx(0.48) and second.busy_s[0] == pytest.approx(0.48)


def test_the_offering_rank_and_its_helpers_report_their_share_in_one_pass() -> None:
    """What the agents' step events carry (`one_piece_s`): their own share's time in one
    pass where the step ran otherwise, nothing where it ran as planned."""
    model = _model()
    batches = np.full(4, 40.0)
    factors = np.array([1.0, 1.0, 1.0, 3.0])
    own = 0.01 * batches * factors
    assert model.step(own, batches, factors).one_piece_s is None  # nobody offered yet
    shared = model.step(own, batches, factors).one_piece_s
    assert shared is not None and shared.tolist() == pytest.approx(own.tolist())


def test_the_rank_stops_offering_once_it_is_fast_again() -> None:
    model = _model()
    batches = np.full(4, 40.0)
    slow = np.array([1.0, 1.0, 1.0, 3.0])
    for _ in range(2):
        model.step(0.01 * batches * slow, batches, slow)
    assert model.offered == {3}
    well = np.ones(4)
    model.step(0.01 * batches * well, batches, well)
    assert model.offered == {3}  # decided on the slow step before
    done = model.step(0.01 * batches * well, batches, well)
    assert model.offered == frozenset() and done.compute_s == pytest.approx(0.4)


def _late(fixed_s: float = 0.0) -> SharingModel:
    params = ShareParams(True, chunks=4, late=True)
    return SharingModel(params, fixed_s=fixed_s, per_sample_s=0.01)


def test_a_late_offer_shares_the_first_slow_step() -> None:
    """`share_late`: a rank 3x slow from this step computes its head (a quarter, 10
    samples: 0.3 s) and offers the other 30 mid-step; offers at the step's start would
    wait for the next step and this one would take 1.2 s."""
    model = _late()
    batches = np.full(4, 40.0)
    well, slow = np.ones(4), np.array([1.0, 1.0, 1.0, 3.0])
    model.step(0.01 * batches * well, batches, well)  # paces known
    done = model.step(0.01 * batches * slow, batches, slow)
    assert model.offered == frozenset()  # nobody offered at the step's start
    # Rank 3 pools from 0.3 s (its head done) and the others from 0.4 s (their own
    # done, all decided by 0.3): 30 samples, 3.33 of them by rank 3 alone, the rest at
    # 3 + 1/3 ranks' speed: the level at 0.48 s, plus half a micro-batch (7.5 samples)
    # at a helper's pace.
    level = 0.4 + (30 - 100 / 3 * 0.1) / (300 + 100 / 3)
    assert level == pytest.approx(0.48)
    assert done.compute_s == pytest.approx(level + 0.5 * 0.075)
    assert done.compute_s < 1.2
    assert done.samples.sum() == pytest.approx(160.0)
    assert done.busy_s[3] == pytest.approx(level)
    assert model.paces is not None and model.paces[3].own == pytest.approx(0.03)  # its head's


def test_late_offers_cost_a_healthy_step_one_more_fixed_part() -> None:
    """A decider computes its share in two pieces (head and tail) whether it offers or
    not: a healthy step pays one more fixed part; a rank under accumulation (not a
    decider) does not, and never offers late."""
    model = _late(fixed_s=0.002)
    batches = np.full(4, 40.0)
    factors = np.ones(4)
    own = (0.002 + 0.01 * batches) * factors
    deciders = np.array([True, True, True, False])
    model.step(own, batches, factors, deciders)
    done = model.step(own, batches, factors, deciders)
    assert done.busy_s.tolist() == pytest.approx([0.404, 0.404, 0.404, 0.402])
    slow = np.array([1.0, 1.0, 1.0, 3.0])
    model.step((0.002 + 0.01 * batches) * slow, batches, slow, deciders)
    assert model.offered == frozenset()  # rank 3 cannot offer late: it is no decider


def test_sharing_brings_antdt_nd_near_the_oracle_in_the_non_dedicated_scenario() -> None:
    """Figures of the example scenario (256 ranks), short: antdt-nd with work sharing
    on beside antdt-nd without it and the oracle of the same draws."""
    from antdt.sim.files import load_scenario
    from antdt.sim.run import run_policy, run_reference
    from tests.unit.test_sim import EXAMPLES

    sc = load_scenario(EXAMPLES / "non_dedicated.toml").model_copy(update={"steps": 300})
    alone = sc.model_copy(update={"policy_params": {**sc.policy_params, "work_sharing": "off"}})
    shared = sc  # on by default under antdt-nd; late offers on in the file
    oracle, _ = run_reference(sc)
    alone_s, with_sharing = (run_policy(s, "antdt-nd").job_s for s in (alone, shared))
    assert with_sharing < alone_s
    # 0.93 (0.82 while a rank stopped offering at the offer ratio: on every other step)
    assert oracle.job_s / with_sharing > 0.9, (oracle.job_s, with_sharing)


_PACE = st.one_of(st.just(0.0), st.floats(1e-4, 1e-2))


@settings(max_examples=300, deadline=None)
@given(
    ranks=st.lists(
        st.tuples(_PACE, _PACE, st.booleans(), st.integers(0, 64)), min_size=0, max_size=16
    ),
    ratio=st.sampled_from([1.05, 1.3, 1.5, 2.0]),
)
def test_the_offer_rule_over_columns_is_the_agents_rule(
    ranks: list[tuple[float, float, bool, int]], ratio: float
) -> None:
    paces = [Pace(own, helping) for own, helping, _, _ in ranks]
    offered = frozenset(r for r, (_, _, o, _) in enumerate(ranks) if o)
    samples = [n for _, _, _, n in ranks]
    own, helping = np.array([p.own for p in paces]), np.array([p.helping for p in paces])
    mask = np.array([o for _, _, o, _ in ranks], dtype=bool)
    found = offering_columns(own, helping, mask, np.array(samples, dtype=float), ratio)
    assert set(np.flatnonzero(found).tolist()) == offering(paces, offered, samples, ratio)
    assert one_piece_scale_columns(own, helping, mask) == one_piece_scale(paces, offered)
    assert late_pace_limit_columns(own, ratio) == late_pace_limit(paces, ratio)
