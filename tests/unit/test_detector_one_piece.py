"""Steps that work sharing ran in several passes are judged as the rank's planned batch
in one pass (`StepEvent.one_piece_s`): a helped straggler's speed model says how slow it
is, not how slow its micro-batches were, and helpers do not look slow for their help."""

from __future__ import annotations

import random

from antdt.services.monitor.detector import JobDetector

JOB, WORLD, BATCH, ONSET, STEPS = "j", 4, 64, 16, 96
#: One pass of the demo-like model: 16 ms fixed, 1 ms a sample (64 samples: 80 ms).
FIXED_S, PER_SAMPLE_S, SLOW = 0.016, 0.001, 3.0


def _pass_s(samples: int, factor: float = 1.0) -> float:
    return factor * (FIXED_S + PER_SAMPLE_S * samples)


def _steps(report_one_piece: bool, seed: int = 3) -> JobDetector:
    """Rank 3 three times slow from ONSET, offering its share as 8 micro-batches of 8
    every step; the others compute their own share in one pass and 1-3 of its
    micro-batches each, it the rest."""
    rng, detector = random.Random(seed), JobDetector(JOB, WORLD)
    t = 0.0
    for step in range(STEPS):
        rows, slow = [], step >= ONSET
        taken = [rng.randint(1, 3) for _ in range(3)] if slow else [0, 0, 0]
        for rank in range(WORLD):
            noise = rng.uniform(0.97, 1.03)
            if rank < 3:
                samples = BATCH + 8 * taken[rank]
                compute = noise * (_pass_s(BATCH) + taken[rank] * _pass_s(8))
                one_piece = noise * _pass_s(BATCH) if taken[rank] else None
            elif slow:
                left = 8 - sum(taken)
                samples, compute = 8 * left, noise * left * _pass_s(8, SLOW)
                one_piece = noise * _pass_s(BATCH, SLOW) * 0.98  # its estimate, not exact
            else:
                samples, compute, one_piece = BATCH, noise * _pass_s(BATCH), None
            rows.append((rank, samples, compute, one_piece if report_one_piece else None))
        step_s = max(r[2] for r in rows) + 0.005
        for rank, samples, compute, one_piece in rows:
            fields = (JOB, rank, f"h{rank}", step, 0, BATCH, t, t + step_s)
            fields += (samples, compute, 0.0, step_s - compute, step_s, None, None, one_piece)
            detector.ingest_fields(fields, t + step_s)  # type: ignore[arg-type]
        t += step_s
    return detector


def _slowness(detector: JobDetector) -> list[float]:
    """Each rank's per-sample time by its model over rank 0's."""
    ranks = detector.health(1e6).ranks
    assert all(r.per_sample_s for r in ranks), [r.per_sample_s for r in ranks]
    return [r.per_sample_s / ranks[0].per_sample_s for r in ranks]  # type: ignore[operator]


def test_a_helped_straggler_is_judged_at_its_one_pass_speed() -> None:
    detector = _steps(report_one_piece=True)
    slowness = _slowness(detector)
    assert 2.7 <= slowness[3] <= 3.3, slowness
    assert all(0.9 <= s <= 1.1 for s in slowness[:3]), slowness
    assert [i.rank for i in detector.open_incidents] == [3]


def test_judged_on_its_micro_batches_it_looks_far_slower_than_it_is() -> None:
    """What `one_piece_s` mends: the same steps, judged raw."""
    slowness = _slowness(_steps(report_one_piece=False))
    assert slowness[3] > 4.0, slowness


def test_a_one_piece_time_out_of_range_is_refused_and_counted() -> None:
    detector = JobDetector(JOB, WORLD)
    for bad in (float("nan"), -1.0, 1e8, "7"):
        fields = (JOB, 0, "h0", 1, 0, BATCH, 0.0, 0.1, BATCH, 0.08, 0.0, 0.01, 0.1)
        detector.ingest_fields((*fields, None, None, bad), 1.0)  # type: ignore[arg-type]
    assert detector.rejected == {"bad_duration": 4}
    assert detector.health(1.0).ranks[0].last_step == 0


def test_a_step_of_columns_with_a_bad_one_piece_time_is_screened_row_by_row() -> None:
    """Bulk screening does not raise on a value that is not a number: the rows go one by
    one, the bad one refused and counted, the others taken."""
    from antdt.services.monitor import StepColumns

    detector = JobDetector(JOB, 2)
    figures = [[0, 1], ["h0", "h1"], [0, 0], [0, 0], [BATCH] * 2, [0.0] * 2, [0.1] * 2]
    figures += [[BATCH] * 2, [0.08] * 2, [0.0] * 2, [0.01] * 2, [0.1] * 2, None]
    columns = StepColumns(JOB, *figures, ["7", 0.08])  # type: ignore[arg-type]
    assert detector.ingest_step(columns, 1.0) == []
    assert detector.rejected == {"bad_duration": 1}
    assert [r.last_step for r in detector._ranks] == [-1, 0]  # rank 0's step not taken


def _columns(rows: list[tuple[int, int, float, float | None]], step: int, t: float) -> tuple:  # type: ignore[type-arg]
    """One step's figures as StepColumns fields after the job (one-piece column last)."""
    step_s = max(r[2] for r in rows) + 0.005
    n = len(rows)
    return (
        [r[0] for r in rows],
        [f"h{r[0]}" for r in rows],
        [step] * n,
        [0] * n,
        [BATCH] * n,
        [t] * n,
        [t + step_s] * n,
        [r[1] for r in rows],
        [r[2] for r in rows],
        [0.0] * n,
        [step_s - r[2] for r in rows],
        [step_s] * n,
        None,
        [r[3] for r in rows],
    )


def test_a_one_piece_column_as_an_array_with_nan_for_none_is_the_list_with_none() -> None:
    """The simulator's bulk form: NaN where a row carries none, the same judgements."""
    import numpy as np

    from antdt.services.monitor import StepColumns

    rng, listed, arrayed = random.Random(5), JobDetector(JOB, WORLD), JobDetector(JOB, WORLD)
    t = 0.0
    for step in range(STEPS):
        slow = step >= ONSET
        rows = [
            (r, BATCH, _pass_s(BATCH, SLOW if slow and r == 3 else rng.uniform(0.97, 1.03)), None)
            for r in range(WORLD)
        ]
        if slow:  # rank 3 helped: 16 samples of its own, judged at its one pass
            rows[3] = (3, 16, _pass_s(16, SLOW), _pass_s(BATCH, SLOW))
        figures = _columns(rows, step, t)
        pieces = np.array([np.nan if p is None else p for p in figures[-1]])
        for detector, column in ((listed, figures[-1]), (arrayed, pieces)):
            detector.ingest_step(StepColumns(JOB, *figures[:-1], column), t + 0.2)  # type: ignore[arg-type]
        t += 0.2
    assert [i.rank for i in arrayed.open_incidents] == [i.rank for i in listed.open_incidents]
    assert [i.rank for i in listed.open_incidents] == [3]
    assert arrayed.health(t).ranks == listed.health(t).ranks
    assert arrayed.rejected == listed.rejected == {}


def test_an_array_one_piece_time_out_of_range_is_refused_and_counted() -> None:
    import numpy as np

    from antdt.services.monitor import StepColumns

    for bad in (-1.0, float("inf"), 1e8):
        detector = JobDetector(JOB, 2)
        rows = [(0, BATCH, 0.08, bad), (1, BATCH, 0.08, float("nan"))]
        figures = _columns(rows, 0, 0.0)  # type: ignore[arg-type]
        columns = StepColumns(JOB, *figures[:-1], np.array(figures[-1]))  # type: ignore[arg-type]
        assert detector.ingest_step(columns, 1.0) == []
        assert detector.rejected == {"bad_duration": 1}
        assert [r.last_step for r in detector._ranks] == [-1, 0]  # rank 1's taken
