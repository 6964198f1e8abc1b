"""`summarize_many` is `summarize` of each window, float for float: windows of one
length with no costs before or a window's worth go through arrays, any other (short,
unmeasured, NaN, a previous window of another length) alone, their step figures
included; the windows read where they lie, rows of a job's OpenWindows."""

from __future__ import annotations

import random

import numpy as np
import pytest

from antdt.services.monitor.openwindows import OpenWindows
from antdt.services.monitor.reference import ReferenceConfig
from antdt.services.monitor.summaries import summarize_many
from antdt.services.monitor.windows import Row, summarized


def _window(rng: random.Random, steps: int) -> list[Row]:
    odd = rng.random() < 0.1  # a step with no samples, no compute, or a NaN figure
    rows: list[Row] = []
    for _ in range(steps):
        n = rng.choice((32, 32, 17, 1))
        c = 0.03 * rng.lognormvariate(0.0, 0.3)
        d, m = rng.choice((0.0, rng.uniform(0.0, 0.02))), rng.uniform(0.0, 0.02)
        s = rng.choice((c + d + m, (c + d + m) * 0.9))  # parts over the step: shares clamped
        rows.append((n, c, d, m, s))
    if odd:
        at, pick = rng.randrange(steps), rng.randrange(3)
        n, c, d, m, s = rows[at]
        rows[at] = ((0, c, d, m, s), (n, 0.0, d, m, s), (n, c, d, m, float("nan")))[pick]
    return rows


@pytest.mark.parametrize("seed", range(8))
def test_many_windows_summarized_at_once_are_each_summarized_alone(seed: int) -> None:
    rng = random.Random(seed)
    config = ReferenceConfig(level_quantile=rng.choice((0.25, 0.5, 0.1)))
    steps = rng.choice((8, 7, 1, 2))
    windows = [_window(rng, steps if rng.random() < 0.95 else steps - 1) for _ in range(60)]
    shorter = min(3, steps - 1)  # costs of a window of another length: alone
    previous = [
        sorted(rng.uniform(0.0005, 0.002) for _ in range(rng.choice((0, steps, steps, shorter))))
        for _ in windows
    ]
    block = OpenWindows(len(windows) + 2, steps)
    rows = np.array(rng.sample(range(len(windows) + 2), len(windows)), dtype=np.int64)
    for row, window, before in zip(rows.tolist(), windows, previous, strict=True):
        for step in window:
            block.row(row).append(step)
        block.row(row).keep_costs(before)
    for fixed in (0.0, 6.5):
        alone = [summarized(w, p, fixed, config) for w, p in zip(windows, previous, strict=True)]
        together = summarize_many(block, rows, fixed, config)
        found = [together.summary(i) for i in range(len(windows))]
        assert repr(found) == repr(alone)  # NaN included: the same floats
        assert repr(together.stats) == repr([a and a[0] for a in alone])
        assert any(alone) or steps == 1
        assert len(together.together) and len(together.alone)
    assert summarize_many(block, rows[:0], 0.0, config).stats == []


def test_a_windows_costs_before_are_kept_and_forgotten() -> None:
    block = OpenWindows(2, 3)
    block.row(1).keep_costs([0.5, 0.75])
    block.keep_before(np.array([0]), np.array([[0.1, 0.2, 0.3]]))
    assert block.row(0).costs_before() == [0.1, 0.2, 0.3]
    assert block.row(1).costs_before() == [0.5, 0.75]
    block.row(0).forget_costs()
    assert block.row(0).costs_before() == [] and block.row(1) != block.row(0)


def test_an_open_window_reads_back_its_steps_and_joins_many_at_once() -> None:
    block = OpenWindows(3, 2)
    block.row(1).append((32, 0.5, 0.25, 0.125, 1.0))
    assert block.add(
        np.array([2, 1]), [16, 8], ([0.1, 0.2], [0.0, 0.0], [0.3, 0.4], [1.0, 2.0])
    ).tolist() == [1, 2]
    assert block.row(1).rows() == [(32, 0.5, 0.25, 0.125, 1.0), (8, 0.2, 0.0, 0.4, 2.0)]
    assert block.row(2).rows() == [(16, 0.1, 0.0, 0.3, 1.0)] and not block.row(0)
    assert [type(n) for n, *_ in block.row(1)] == [int, int]
    block.clear(np.array([1]))
    assert len(block.row(1)) == 0 and len(block.row(2)) == 1
