"""The simulator's oracle knows every rank's speed in advance and plans on it; the
step's random jitter it meets as every policy does."""

from __future__ import annotations

import numpy as np
import pytest

from antdt.sim.files import parse_scenario
from antdt.sim.run import run_reference

CALM = """
name = "calm"
seed = 3
ranks = 32
steps = 200
noise_cv = 0.05
"""

SLOWED = (
    CALM
    + """
[[slowdowns]]
ranks = [5]
start_step = 50
factor = 3.0
"""
)


def test_without_slowdowns_the_oracle_is_the_healthy_cluster_jitter_and_all() -> None:
    """Equal speeds: the oracle's plan is equal shares, so each step it meets the same
    jitter as the healthy run with equal batches (an oracle that knew the jitter would
    shift samples off each step's slowest draw and beat it)."""
    oracle, healthy = run_reference(parse_scenario(CALM))
    assert oracle.step_s == pytest.approx(healthy.step_s, rel=1e-12)


def test_the_oracle_plans_a_slowed_rank_down_by_its_speed() -> None:
    sc = parse_scenario(SLOWED)
    oracle, healthy = run_reference(sc)
    # Before the slowdown as healthy; after it, the 3x rank's share is cut so the job
    # steps at 32 / (31 + 1/3) of a healthy step on average, jitter aside.
    assert oracle.step_s[:50] == pytest.approx(healthy.step_s[:50], rel=1e-12)
    ratio = float(np.mean(oracle.compute_s[50:]) / np.mean(healthy.compute_s[50:]))
    assert ratio == pytest.approx(32 / (31 + 1 / 3), rel=0.03)
