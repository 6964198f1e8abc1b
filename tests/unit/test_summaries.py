"""`summarize_many` is `summarize` of each window, float for float: windows of one
length with no costs before or a window's worth go through arrays, any other (short,
unmeasured, NaN, a previous window of another length) alone, their step figures
included."""

from __future__ import annotations

import random

import pytest

from antdt.services.monitor.reference import ReferenceConfig
from antdt.services.monitor.summaries import summarize_many
from antdt.services.monitor.windows import Row, summarize


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
    windows = [_window(rng, steps if rng.random() < 0.95 else steps + 1) for _ in range(60)]
    previous = [
        tuple(sorted(rng.uniform(0.0005, 0.002) for _ in range(rng.choice((0, steps, steps, 3)))))
        for _ in windows
    ]
    for fixed in (0.0, 6.5):
        alone = [summarize(w, p, fixed, config) for w, p in zip(windows, previous, strict=True)]
        together = summarize_many(windows, previous, fixed, config)
        assert repr(together) == repr(alone)  # NaN included: the same floats
        assert any(alone) or steps == 1
    assert summarize_many([], [], 0.0, config) == []
