"""Many ranks' models at once (`fits.fit_one_batch_many`): bit for bit `fit_speed` of
each history it takes, and the histories it leaves to `fit_speed` left out."""

from __future__ import annotations

import random

import pytest

from antdt.services.monitor.fits import fit_one_batch_many
from antdt.services.monitor.history import Histories, History
from antdt.services.monitor.speed import SpeedConfig, fit_speed


def _filled(history: History, rng: random.Random, kind: str, length: int) -> History:
    for i in range(length):
        t = 0.03 * rng.lognormvariate(0.0, 0.3)
        batch = 32
        if kind == "two sizes" and i >= length // 2:
            batch = 16
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
    made alone: each one-batch history is fitted, as `fit_speed` fits it; any other is
    left out."""
    rng = random.Random(seed)
    config = SpeedConfig()
    kinds = ["plain"] * 100 + ["two sizes", "bad", "huge"] * 3
    block = Histories(len(kinds), 96)
    histories = [
        _filled(block.row(i), rng, kind, rng.choice((3, 8, 50, 96, 130)))
        for i, kind in enumerate(kinds)
    ]
    histories += [_filled(History(96), rng, "plain", 20) for _ in range(3)]
    fitted = fit_one_batch_many(histories[::-1], fixed, config)  # any order of rows
    by_history = {len(histories) - 1 - i: model for i, model in fitted.items()}
    for i, history in enumerate(histories):
        one_batch = history.one_batch() is not None
        if i in by_history:
            assert one_batch and by_history[i] == fit_speed(history, fixed, config)
        else:  # left to fit_speed's general path
            assert not one_batch or max(history.times) > 1e300
    assert sum(m is not None for m in by_history.values()) > 50
    assert any(len(h) < config.min_steps for h in histories)  # fitted as None


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
            stale = [not pace._fitted(m) for m in detector._ranks]
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
