"""Per-rank step-time models (antdt.services.monitor.speed): fit, fallbacks, pooling."""

from __future__ import annotations

import collections
import itertools
import random

import numpy as np
import pytest

from antdt.services.monitor.speed import (
    SpeedConfig,
    SpeedModel,
    batch_levels,
    fit_speed,
    pooled_fixed_samples,
    quantile,
    unit_cost,
)

EXACT = SpeedConfig(min_steps=1, line_steps=1, quantile=0.5)


def steps(batch: int, seconds: float, count: int) -> list[tuple[int, float]]:
    return [(batch, seconds)] * count


def noisy(fixed_s: float, per_sample_s: float, batches: list[int], seed: int) -> list:
    """Steps with shared-core noise: 3-8% jitter, a neighbour slowing 25% of the steps
    by 30-50%, rare 1.5-3x spikes."""
    rng, out = random.Random(seed), []
    for batch in batches:
        value = (fixed_s + per_sample_s * batch) * rng.uniform(0.94, 1.06)
        draw = rng.random()
        if draw < 0.25:
            value *= rng.uniform(1.3, 1.5)
        elif draw > 0.99:
            value *= rng.uniform(1.5, 3.0)
        out.append((batch, value))
    return out


@pytest.mark.parametrize(
    ("history", "fixed_s", "per_sample_s", "batch_sizes"),
    [
        # two batch sizes: the line through them
        (steps(32, 0.064, 3) + steps(16, 0.048, 3), 0.032, 0.001, 2),
        # no fixed part
        (steps(10, 0.02, 2) + steps(40, 0.08, 2), 0.0, 0.002, 2),
        # five sizes, one far off the line: Theil-Sen keeps the line of the other four
        (
            [(b, 0.01 + 0.001 * b) for b in (10, 20, 30, 40)] * 2 + steps(50, 0.15, 2),
            0.01,
            0.001,
            5,
        ),
        # a line below zero at batch 0 (noise): no fixed part, per-sample through zero
        (steps(10, 0.009, 2) + steps(20, 0.021, 2), 0.0, 0.000975, 2),
    ],
)
def test_fit_through_the_levels_of_the_batch_sizes(
    history: list, fixed_s: float, per_sample_s: float, batch_sizes: int
) -> None:
    model = fit_speed(history, config=EXACT)
    assert model is not None
    assert model.fixed_s == pytest.approx(fixed_s, abs=1e-9)
    assert model.per_sample_s == pytest.approx(per_sample_s)
    assert model.batch_sizes == batch_sizes


@pytest.mark.parametrize(
    ("history", "pooled", "fixed_s", "per_sample_s"),
    [
        # one batch size, no pool: all of it per sample (today's compute per sample)
        (steps(32, 0.064, 3), 0.0, 0.0, 0.002),
        # one batch size, the job's pool says 32 samples' worth is fixed
        (steps(32, 0.064, 3), 32.0, 0.032, 0.001),
        # sizes too close for a slope (within 15%): the one with most steps, with the pool
        (steps(32, 0.064, 3) + steps(30, 0.062, 5), 32.0, 0.032, 0.001),
        # a slope that is not positive is noise: the size with most steps, with the pool
        (steps(16, 0.05, 5) + steps(32, 0.049, 3), 16.0, 0.025, 0.05 / 32),
        # a negative pool means nothing: no fixed part
        (steps(32, 0.064, 3), -5.0, 0.0, 0.002),
    ],
)
def test_fall_back_on_the_pooled_fixed_part(
    history: list, pooled: float, fixed_s: float, per_sample_s: float
) -> None:
    model = fit_speed(history, pooled, EXACT)
    assert model is not None and model.batch_sizes == 1
    assert model.fixed_s == pytest.approx(fixed_s)
    assert model.per_sample_s == pytest.approx(per_sample_s)


@pytest.mark.parametrize(
    ("history", "config", "fits"),
    [
        ([], SpeedConfig(), False),
        (steps(32, 0.06, 7), SpeedConfig(min_steps=8), False),
        (steps(32, 0.06, 8), SpeedConfig(min_steps=8), True),
        # zero samples, zero or non-finite times are not steps to fit on
        (steps(0, 0.06, 9) + steps(32, 0.0, 9) + steps(32, float("inf"), 9), SpeedConfig(), False),
    ],
)
def test_too_few_steps_fit_nothing(history: list, config: SpeedConfig, fits: bool) -> None:
    assert (fit_speed(history, config=config) is not None) is fits


def test_a_slope_needs_line_steps_at_each_size() -> None:
    config = SpeedConfig(min_steps=2, line_steps=4, quantile=0.5)
    few = steps(32, 0.064, 4) + steps(16, 0.048, 3)
    assert fit_speed(few, 0.0, config) == SpeedModel(0.0, 0.064 / 32, 1)
    enough = few + steps(16, 0.048, 1)
    model = fit_speed(enough, 0.0, config)
    assert model is not None and model.batch_sizes == 2
    assert model.fixed_s == pytest.approx(0.032)


@pytest.mark.parametrize("seed", range(5))
def test_shared_core_noise_moves_the_fit_little(seed: int) -> None:
    """Steps swinging 30-50% in a quarter of them, at 64 and 32 samples: both parts within
    15% (the 25% quantile per batch size sits below the neighbour's hits)."""
    batches = [64] * 40 + [32] * 40
    model = fit_speed(noisy(0.032, 0.001, batches, seed))
    assert model is not None and model.batch_sizes == 2
    assert model.fixed_s == pytest.approx(0.032, rel=0.15)
    assert model.per_sample_s == pytest.approx(0.001, rel=0.15)


def test_predict_and_fixed_samples() -> None:
    model = SpeedModel(0.032, 0.001, 2)
    assert model.predict(0) == pytest.approx(0.032)
    assert model.predict(48) == pytest.approx(0.080)
    assert model.fixed_samples == pytest.approx(32.0)


@pytest.mark.parametrize(
    ("models", "default", "pooled"),
    [
        ([], 7.0, 7.0),
        ([None, SpeedModel(0.01, 0.001, 1)], 7.0, 7.0),  # one-size models only echo a pool
        ([SpeedModel(0.01, 0.001, 2)], 0.0, 10.0),
        # the median: a rank's noisy fit cannot drag the job's part
        (
            [SpeedModel(0.01, 0.001, 2), SpeedModel(0.03, 0.002, 3), SpeedModel(0.5, 0.001, 2)],
            0.0,
            15.0,
        ),
    ],
)
def test_pooled_fixed_samples(
    models: list[SpeedModel | None], default: float, pooled: float
) -> None:
    assert pooled_fixed_samples(models, default) == pytest.approx(pooled)


def test_unit_cost_is_the_same_for_equal_speed_at_any_batch() -> None:
    """Compute per sample rises as a batch shrinks (the fixed part spreads over fewer
    samples); per sample-equivalent it does not."""
    model = SpeedModel(0.032, 0.001, 2)
    per_sample = [model.predict(b) / b for b in (16, 32, 64)]
    assert per_sample[0] > 1.4 * per_sample[2]
    costs = [unit_cost(b, model.predict(b), model.fixed_samples) for b in (16, 32, 64)]
    assert costs == pytest.approx([0.001] * 3)
    assert unit_cost(32, 0.064, 0.0) == pytest.approx(0.002)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([3.0], 0.25, 3.0),
        ([4.0, 1.0, 3.0, 2.0], 0.0, 1.0),
        ([4.0, 1.0, 3.0, 2.0], 1.0, 4.0),
        ([4.0, 1.0, 3.0, 2.0], 0.5, 2.5),
        ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], 0.25, 2.75),
    ],
)
def test_quantile(values: list[float], q: float, expected: float) -> None:
    assert quantile(values, q) == pytest.approx(expected)


def test_batch_levels_keep_sizes_with_enough_steps() -> None:
    config = SpeedConfig(min_steps=2, line_steps=2, quantile=0.0)
    levels = batch_levels([*steps(8, 0.2, 1), (16, 0.3), (16, 0.1), (16, 0.2)], config)
    assert list(levels) == [16]
    assert levels[16].seconds == pytest.approx(0.1) and levels[16].steps == 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_steps": 0},
        {"min_steps": 9, "line_steps": 8},
        {"min_spread": 0.0},
        {"quantile": 1.5},
    ],
)
def test_config_refuses_nonsense(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SpeedConfig(**kwargs)


@pytest.mark.parametrize("seed", range(4))
def test_the_levels_of_measurable_steps_are_batch_levels(seed: int) -> None:
    """The shortcut of fit_speed for steps all measurable (a few C calls) gives
    batch_levels' levels, at one batch size or more, and a step with nothing measured
    takes the long way to the same."""
    from antdt.services.monitor.speed import _levels

    rng, config = random.Random(seed), SpeedConfig()
    assert _levels([], config) == {}
    for count in (1, 7, 8, 12, 96):
        history = [(32, 0.032 * rng.lognormvariate(0.0, 0.1)) for _ in range(count)]
        assert _levels(history, config) == batch_levels(history, config)
        for odd in ((16, 0.02), (32, 0.0), (0, 0.01), (32, float("nan")), (32, float("inf"))):
            mixed = [*history, *[odd] * rng.choice((1, 9))]
            assert _levels(mixed, config) == batch_levels(mixed, config)
    assert fit_speed(steps(32, 0.04, 8), 8.0) == SpeedModel(0.008, 0.001, 1)


@pytest.mark.parametrize("seed", range(16))
def test_a_history_keeps_its_order_and_runs_and_fits_as_its_steps(seed: int) -> None:
    """A History keeps its measurable times in order, its count of batch changes, its
    bad times and a version that changes with every change, through adds (read after
    each or after many; alone or with others', rows of one block at once or not),
    evictions, pops and clears, and its fit is bit for bit that of the same steps as a
    list; the span around its latest change of batch size names those steps, and never
    other steps later."""
    from antdt.services.monitor.history import Histories, History

    rng = random.Random(seed)
    odd = (0.0, -1.0, float("nan"), float("inf"), 1e301)
    maxlen = rng.choice((2, 8, 20, 96))
    model = collections.deque[tuple[int, float]](maxlen=maxlen)
    if seed % 2:  # rows of a job's block
        block = Histories(5, maxlen)
        history, others = block.row(2), [block.row(i) for i in (4, 0, 1)]
    else:
        history, others = History(maxlen), [History(maxlen) for _ in range(3)]
    read_every = rng.choice((1, 3, 50))
    version = history.version
    spans: dict[tuple[int, int, int], list[tuple[int, float]]] = {}
    for i in range(600):
        pick, changed = rng.random(), True
        if pick < 0.02:
            history.clear()
            model.clear()
        elif pick < 0.1 and model:
            assert repr(history.popleft()) == repr(model.popleft())
        elif pick < 0.13 and model:
            keep = rng.randrange(len(model) + 1)
            history.keep_latest(keep)
            changed = keep < len(model)
            while len(model) > keep:
                model.popleft()
        else:
            t = rng.choice(odd) if rng.random() < 0.02 else 0.03 * rng.lognormvariate(0.0, 0.2)
            step = (rng.choice((32, 32, 32, 16, 0)) if rng.random() < 0.1 else 32, t)
            rows, samples, times = [*others, history], [32] * 3 + [step[0]], [0.1] * 3 + [t]
            if rng.random() < 0.5:
                history.add(*step)
            elif seed % 2:  # rows of a job's block: added at once
                block.add(np.array([h.row for h in rows]), samples, times)
            else:
                for each, n, time in zip(rows, samples, times, strict=True):
                    each.add(n, time)
            model.append(step)
        assert (history.version != version) is changed
        version = history.version
        ends = (model[0][0], model[-1][0]) if model else None
        assert history.first_and_latest() == ends and history.version == version
        all_ends = [h.first_and_latest() for h in (history, *others)]
        two_sizes = any(e is not None and e[0] != e[1] for e in all_ends)
        assert History.any_two_sizes_at_ends([history, *others]) is two_sizes
        every = [history, *others]
        assert History.last_change_spans(every, 5) == [h.last_change_span(5) for h in every]
        if i % read_every:
            continue
        steps_ = list(history)
        assert repr(steps_) == repr(list(model))  # a NaN read back is another object
        good = sorted(t for _, t in steps_ if 0.0 < t < float("inf"))
        assert history.ordered == good
        assert history.bad == len(steps_) - len(good)
        assert history.changes == sum(a[0] != b[0] for a, b in itertools.pairwise(steps_))
        batches = {b for b, _ in steps_}
        one = len(batches) == 1 and len(good) == len(steps_) and 32 in batches
        assert (history.one_batch() == 32) is one
        for fixed in (0.0, 6.5):
            assert fit_speed(history, fixed) == fit_speed(steps_, fixed)
        span, last = history.last_change_span(5), len(steps_) - 1
        change = next((i for i in range(last, 0, -1) if steps_[i][0] != steps_[i - 1][0]), 0)
        if change == 0:
            assert span is None
        else:
            around = steps_[max(0, change - 5) : change + 5]
            assert span is not None
            assert repr(history.steps_between(span[1], span[2])) == repr(around)
            assert repr(spans.setdefault(span, around)) == repr(around)  # the same span, steps
        assert history.version == version  # reads change nothing
