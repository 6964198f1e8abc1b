"""Many ranks' models at once (`fits.fit_many`, `fits.fit_spans`,
`anysizes.fit_any_sizes`): bit for bit `fit_speed` of each history (or span of one) it
takes, the others left out."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from antdt.services.monitor.anysizes import fit_any_sizes
from antdt.services.monitor.fits import fit_many, fit_spans
from antdt.services.monitor.history import Histories, History
from antdt.services.monitor.speed import ONE_BATCH_LIMIT, SpeedConfig, fit_speed


def _filled(history: History, rng: random.Random, kind: str, length: int) -> History:
    """`length` steps of `kind`: one batch size; two (a plan's switch at a random step to
    a size near, far or above, times a line with a part that may be negative, or
    falling); three; or one with a bad or a huge time last."""
    second = rng.choice((16, 30, 8, 64, 31))
    switch = rng.randrange(length + 1)
    part, per_sample = rng.uniform(-0.01, 0.02), rng.choice((0.001, -0.0002))
    for i in range(length):
        noise = rng.lognormvariate(0.0, 0.3)
        batch, t = 32, 0.03 * noise
        if kind in ("two sizes", "three sizes") and i >= switch:
            batch = second if kind == "two sizes" or i % 3 else 12
            t = max(1e-6, (part + per_sample * batch + 0.02) * noise)
        elif kind == "bad" and i == length - 1:
            t = float("nan")
        elif kind == "huge" and i == length - 1:
            t = 1e301
        history.add(batch, t)
    return history


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fixed", [0.0, 6.5, -1.0])
def test_the_models_fitted_at_once_are_fit_speed(seed: int, fixed: float) -> None:
    """Rows of one block (a job's ranks, some wrapped round their ring) and histories
    made alone: each history of one or two batch sizes, every time measurable, is
    fitted as `fit_speed` fits it, bit for bit; any other is left out."""
    rng = random.Random(seed)
    config = SpeedConfig()
    kinds = ["plain"] * 60 + ["two sizes"] * 60 + ["three sizes", "bad", "huge"] * 3
    block = Histories(len(kinds), 96)
    histories = [
        _filled(block.row(i), rng, kind, rng.choice((3, 8, 20, 50, 96, 130)))
        for i, kind in enumerate(kinds)
    ]
    histories += [_filled(History(96), rng, "plain", 20) for _ in range(3)]
    fitted = fit_many(histories[::-1], fixed, config)  # any order of rows
    by_history = {len(histories) - 1 - i: model for i, model in fitted.items()}
    for i, history in enumerate(histories):
        if i in by_history:  # a huge time among too few steps is fitted as None at once
            assert repr(by_history[i]) == repr(fit_speed(history, fixed, config))
        else:  # left to fit_speed: a finite time past ONE_BATCH_LIMIT
            assert any(1e300 < t < math.inf for t in history.times)
    fitted_by = {m.batch_sizes for m in by_history.values() if m is not None}
    assert fitted_by >= {1, 2}  # through one size, and a line through two
    assert sum(m is not None for m in by_history.values()) > 60
    assert any(len(h) < config.min_steps for h in histories)  # fitted as None


@pytest.mark.parametrize("seed", range(4))
def test_full_rows_read_in_their_rings_order_fit_as_fit_speed(seed: int) -> None:
    """Every row full (a job past its first 96 steps), most wrapped round their ring at
    another place, or some not: the full ones read as multisets in the ring's order,
    each history fitted bit for bit as `fit_speed` fits its steps oldest first."""
    rng = random.Random(seed)
    kinds = ["plain"] * 20 + ["two sizes"] * 20 + ["three sizes"] * 10
    block = Histories(len(kinds), 96)
    histories = [
        _filled(block.row(i), rng, kind, rng.randrange(96, 300)) for i, kind in enumerate(kinds)
    ]
    assert (block.held == 96).all() and len(set(block.head.tolist())) > 10
    if seed % 2:  # some rows not full: a straggler's history kept its slow run alone
        for history in histories[::7]:
            history.keep_latest(rng.randrange(10, 90))
    fitted = fit_many(histories, 6.5, SpeedConfig())
    assert len(fitted) == len(kinds)
    for i, history in enumerate(histories):
        assert repr(fitted[i]) == repr(fit_speed(history, 6.5, SpeedConfig()))
    assert {m.batch_sizes for m in fitted.values() if m is not None} >= {1, 2}


def test_a_healths_models_are_each_ranks_fit() -> None:
    """A health of 32 ranks fits their models at once: each one fitted afresh (its
    window closed since the last health) is `fit_speed` of the rank's history, through
    a plan that changes some ranks' batch."""
    from antdt.services.monitor import JobDetector

    world, rng, t = 32, random.Random(3), 1000.0
    detector = JobDetector("job", world)
    pace, seen = detector._pace, 0
    for s in range(60):
        for rank in range(world):
            batch = 16 if rank < 4 and s >= 30 else 32
            c = batch * 0.001 * rng.lognormvariate(0.0, 0.05)
            fields = ("job", rank, f"h{rank}", s, int(s >= 30), batch, t, t + c + 0.005)
            detector.ingest_fields((*fields, batch, c, 0.0, 0.005, c + 0.005), t)  # type: ignore[arg-type]
        t += 0.05
        if s % 3 == 0:
            stale = [not pace._memo.fresh(m, pace.fixed_samples) for m in detector._ranks]
            wanted = [
                fit_speed(m.history, pace.fixed_samples, pace._speed) for m in detector._ranks
            ]
            rows = detector.health(t).ranks
            for row, model, afresh in zip(rows, wanted, stale, strict=True):
                if afresh:
                    assert (row.per_sample_s, row.fixed_s) == (
                        (model.per_sample_s, model.fixed_s) if model else (None, None)
                    )
                    seen += model is not None
    assert seen > world * 5


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("fixed", [0.0, 6.5, -1.0])
def test_the_span_models_fitted_at_once_are_fit_speed_of_the_span(seed: int, fixed: float) -> None:
    """A round of windows refits each rank's model through the steps around its last
    change of batch size (`fits.fit_spans`): each span of steps, every time measurable
    and within ONE_BATCH_LIMIT, is fitted as `fit_speed` fits its steps, bit for bit;
    any other is left out. Spans as the pace asks them, and drawn ones (cut short,
    empty, past the ring)."""
    rng = random.Random(seed)
    config = SpeedConfig()
    kinds = ["two sizes"] * 80 + ["plain"] * 10 + ["three sizes", "bad", "huge"] * 4
    block = Histories(len(kinds), 96)
    histories = [
        _filled(block.row(i), rng, kind, rng.choice((20, 50, 96, 130, 200)))
        for i, kind in enumerate(kinds)
    ]
    asked = History.last_change_spans(histories, 24)
    spans = []
    for history, span in zip(histories, asked, strict=True):
        entered = history.version  # steps ever joined (nothing removed here)
        if span is None or rng.random() < 0.3:
            start = rng.randrange(entered + 1)
            span = (history.epoch, start, start + rng.randrange(0, 60))
        spans.append(span)
    fitted = fit_spans(histories, spans, fixed, config)
    many_sizes = 0
    for i, (history, span) in enumerate(zip(histories, spans, strict=True)):
        steps = history.steps_between(span[1], span[2])
        expected = fit_speed(steps, fixed, config)
        usable = bool(steps) and all(0 < t <= ONE_BATCH_LIMIT for _, t in steps)
        assert (i in fitted) == usable
        if usable:
            assert repr(fitted[i]) == repr(expected)
            many_sizes += len({n for n, _ in steps}) >= 3
    assert sum(m is not None and m.batch_sizes == 2 for m in fitted.values()) > 5
    assert sum(m is not None and m.batch_sizes == 1 for m in fitted.values()) > 0
    assert many_sizes > 0


def _drawn(history: History, rng: random.Random, length: int) -> History:
    """`length` steps at up to six batch sizes (some not measurable: 0, negative), each
    size's steps in runs or drawn at random, times a line that may fall or cross zero
    low (a fit through zero), equal or noisy (ties of times, and of step counts when
    the runs are even); a few times bad (NaN, inf, 0, negative) or past
    ONE_BATCH_LIMIT."""
    sizes = rng.sample([4, 8, 12, 13, 16, 30, 31, 32, 64, 0, -3], rng.randint(1, 6))
    part, per_sample = rng.uniform(-0.1, 0.02), rng.choice((0.001, -0.0002, 0.0))
    run, steady = rng.choice((8, 12, 24)), rng.random() < 0.3
    bad = (math.nan, math.inf, 0.0, -1.0, 1e301)
    for i in range(length):
        batch = rng.choice(sizes) if rng.random() < 0.5 else sizes[i // run % len(sizes)]
        noise = 1.0 if steady else rng.lognormvariate(0.0, 0.3)
        t = max(1e-6, (part + per_sample * max(batch, 1) + 0.06) * noise)
        history.add(batch, rng.choice(bad) if rng.random() < 0.03 else t)
    return history


@pytest.mark.parametrize("seed", range(8))
def test_histories_of_any_sizes_are_fitted_as_fit_speed(seed: int) -> None:
    """Histories of three sizes or more, some steps not measurable, wrapped round their
    ring or not, under drawn configurations: each one holding no finite time past
    ONE_BATCH_LIMIT is fitted as `fit_speed` fits it, bit for bit (`fits.fit_many`
    through `anysizes.fit_any_sizes`, and that alone over every row)."""
    rng = random.Random(seed)
    config = rng.choice(
        (
            SpeedConfig(),
            SpeedConfig(min_steps=3, line_steps=5, min_spread=0.05),
            SpeedConfig(min_steps=1, line_steps=1, quantile=0.5),
        )
    )
    block = Histories(200, 96)
    histories = [
        _drawn(block.row(i), rng, rng.choice((0, 3, 8, 20, 50, 96, 130))) for i in range(200)
    ]
    samples, times, held = block.in_order(np.arange(200))
    unused = np.arange(96)[None, :] >= held[:, None]
    kinds: set[object] = set()
    for fixed in (0.0, 6.5, -1.0):
        fitted = fit_many(histories, fixed, config)
        alone = fit_any_sizes(samples, times, unused, max(0.0, fixed), config)
        for i, history in enumerate(histories):
            huge = any(1e300 < t < math.inf for t in history.times)
            expected = repr(fit_speed(history, fixed, config))
            assert i in fitted or huge  # a huge time among too few steps: None at once
            assert i not in fitted or repr(fitted[i]) == expected
            assert huge or repr(alone[i]) == expected
            model = alone[i]
            kinds.add(model and (min(model.batch_sizes, 3), model.fixed_s == 0.0))
    assert {None, (1, False), (2, False), (3, False), (3, True)} <= kinds


@pytest.mark.parametrize("seed", range(4))
def test_rows_as_they_lie_hold_the_steps_in_order_as_a_multiset(seed: int) -> None:
    """`Histories.as_held`: whatever a row holds (none, some, full, wrapped, its latest
    kept alone), the slots it marks used hold the steps `in_order` gives, and its latest
    batch size is the newest step's."""
    rng = random.Random(seed)
    block = Histories(40, 16)
    for row in range(40):
        history = block.row(row)
        for _ in range(rng.choice((0, 3, 16, 17, 40))):
            history.add(rng.randint(1, 64), rng.random())
        if len(history) and rng.random() < 0.3:
            history.keep_latest(rng.randrange(len(history) + 1))
    rows = np.array(rng.sample(range(40), 30), dtype=np.int64)
    samples, times, unused, latest = block.as_held(rows)
    in_samples, in_times, held = block.in_order(rows)
    for k, n in enumerate(held.tolist()):
        used = ~unused[k]
        assert int(used.sum()) == n
        assert sorted(times[k][used].tolist()) == sorted(in_times[k][:n].tolist())
        assert sorted(samples[k][used].tolist()) == sorted(in_samples[k][:n].tolist())
        if n:
            assert latest[k] == in_samples[k][n - 1]
