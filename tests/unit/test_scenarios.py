"""Labelled step-trace scenarios (antdt.sim.scenarios): what they promise to contain."""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from dataclasses import replace

import pytest

from antdt.services.monitor import JobDetector
from antdt.sim.scenarios import (
    QUIET,
    Noise,
    Scenario,
    ScenarioSpec,
    Truth,
    fixed_cost,
    half_job,
    healthy_job,
    two_ranks,
    whole_host,
)
from antdt.sim.traces import RankClass


def per_sample(scenario: Scenario, rank: int, steps: range) -> list[float]:
    rows = [row for row in scenario.rows() if row.step in steps]
    return [row.compute_s[rank] / row.batches[rank] for row in rows]


def test_the_same_spec_gives_the_same_trace() -> None:
    a, b = two_ranks(3), two_ranks(3)
    assert list(a.rows()) == list(b.rows()) and a.events() == b.events()
    assert list(a.rows()) != list(two_ranks(4).rows())


@pytest.mark.parametrize(
    ("scenario", "truths", "hosts"),
    [
        (healthy_job(2, steps=10), [Truth.HEALTHY] * 2, ("host0", "host1")),
        (
            whole_host(8, 4, seed=0),
            None,  # drawn: checked below to be one host's four ranks
            ("host0",) * 4 + ("host1",) * 4,
        ),
        (
            Scenario(ScenarioSpec(world=6, ranks_per_host=2, slow_ranks=(0,), slow_hosts=(2,))),
            [Truth.SLOW, Truth.HEALTHY, Truth.HEALTHY, Truth.HEALTHY, Truth.HOST, Truth.HOST],
            ("host0", "host0", "host1", "host1", "host2", "host2"),
        ),
    ],
)
def test_truths_and_hosts(
    scenario: Scenario, truths: list[Truth] | None, hosts: tuple[str, ...]
) -> None:
    assert scenario.hosts == hosts
    if truths is not None:
        assert list(scenario.truths) == truths
    else:
        slow = [r for r, t in enumerate(scenario.truths) if t is Truth.HOST]
        assert len(slow) == 4 and len({hosts[r] for r in slow}) == 1


@pytest.mark.parametrize(
    ("scenario", "slow_count"),
    [(two_ranks(0), 1), (half_job(8, 1), 4), (half_job(16, 2), 8), (whole_host(16, 4, 3), 4)],
)
def test_slowdowns_start_at_the_onset_and_last(scenario: Scenario, slow_count: int) -> None:
    spec, quiet = scenario.spec, Scenario(replace(scenario.spec, noise=QUIET))
    slow = [r for r, t in enumerate(quiet.truths) if t is not Truth.HEALTHY]
    assert len(slow) == slow_count
    for row in quiet.rows():
        expected = spec.sample_s * spec.batch * (spec.factor if row.step >= spec.onset_step else 1)
        assert all(row.compute_s[r] == pytest.approx(expected) for r in slow)
        healthy = [c for r, c in enumerate(row.compute_s) if r not in slow]
        assert healthy == pytest.approx([spec.sample_s * spec.batch] * len(healthy))
    labels = quiet.labels()
    assert [label.klass for label in labels].count(RankClass.PERSISTENT) == slow_count
    assert all(label.onset_step == spec.onset_step for label in labels if label.rank in slow)


def test_noise_swings_30_to_50_percent_between_steps_in_a_share_of_them() -> None:
    """Shared-core noise: per-sample compute swings by 30%+ between consecutive steps in
    15-45% of them, by 50%+ in few, by 2x+ (spikes) in very few; the typical step stays
    near the model."""
    scenario = healthy_job(16, steps=2000, seed=5)
    rows = list(scenario.rows())
    swings, medians = [], []
    for rank in range(16):
        times = [row.compute_s[rank] / row.batches[rank] for row in rows]
        medians.append(statistics.median(times) / scenario.spec.sample_s)
        swings += [abs(math.log(b / a)) for a, b in itertools.pairwise(times)]
    share = {x: sum(s >= math.log(x) for s in swings) / len(swings) for x in (1.3, 1.5, 2.0)}
    assert 0.15 <= share[1.3] <= 0.45 and share[1.5] <= 0.12 and share[2.0] <= 0.03, share
    assert all(0.9 <= m <= 1.15 for m in medians), medians


def test_noise_parameters_are_drawn_per_rank() -> None:
    noise = Noise(hit_share=(0.0, 0.0), spike_share=0.0, drift=0.0, speed_spread=0.0)
    scenario = healthy_job(4, steps=500, seed=1, noise=noise)
    spreads = [statistics.pstdev(per_sample(scenario, r, range(500))) for r in range(4)]
    assert len({round(s, 6) for s in spreads}) == 4  # each rank its own jitter
    assert max(spreads) / scenario.spec.sample_s <= 0.1


def test_fixed_cost_plan_halves_one_rank_and_raises_its_compute_per_sample() -> None:
    scenario = fixed_cost(4, seed=2)
    ((start, plan),) = scenario.spec.plans
    target = plan.index(min(plan))
    assert start == 160 and sum(plan) == 4 * scenario.spec.batch and plan[target] == 17
    rows = list(Scenario(replace(scenario.spec, noise=QUIET)).rows())
    assert rows[159].plan_version == 0 and rows[160].plan_version == 1
    assert rows[160].batches == plan
    before = rows[159].compute_s[target] / rows[159].batches[target]
    after = rows[160].compute_s[target] / rows[160].batches[target]
    assert after / before == pytest.approx((0.032 + 0.017) / 17 / (0.064 / 32))


def test_events_are_a_bulk_synchronous_job_the_detector_accepts() -> None:
    scenario = whole_host(8, 4, seed=1, steps=120)
    events = scenario.events()
    assert [t for t, _ in events] == sorted(t for t, _ in events)
    assert len(events) == 8 * 120
    by_step: dict[int, set[float]] = {}
    for _, event in events:
        by_step.setdefault(event.step, set()).add(event.step_s)
        assert event.host == scenario.hosts[event.rank]
        assert event.compute_s + event.data_wait_s + event.comm_s == pytest.approx(event.step_s)
    assert all(len(step_s) == 1 for step_s in by_step.values())  # one barrier per step
    detector = JobDetector(scenario.spec.job, scenario.spec.world)
    for now, event in events:
        detector.ingest(event, now)
    assert detector.rejected == Counter()
    trace = scenario.trace()
    assert trace.spec.world == 8 and trace.labels == scenario.labels()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"world": 0},
        {"world": 2, "slow_ranks": (2,)},
        {"world": 4, "ranks_per_host": 2, "slow_hosts": (2,)},
        {"world": 2, "plans": ((10, (1, 2, 3)),)},
        {"world": 2, "plans": ((10, (1, 1)), (5, (2, 0)))},
    ],
)
def test_spec_refuses_nonsense(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ScenarioSpec(**kwargs)
