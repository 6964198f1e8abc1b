"""`Judge.judge_many` is `Judge.judge` of each window, judgement for judgement: a
step's windows judged over arrays (the other ranks' medians, the first test of each
rule) give the verdicts, causes and figures the one-by-one rules give; and a step of a
large job as columns ends as its events one by one."""

from __future__ import annotations

import random

import pytest

from antdt.services.monitor import DetectorConfig, JobDetector, StepColumns
from antdt.services.monitor.judge import Judge
from antdt.services.monitor.reference import Evidence
from antdt.services.monitor.windows import Row, WindowStats, summarize


def _window(rng: random.Random, config: DetectorConfig, kind: str) -> WindowStats:
    scale = {"slow": 2.5, "leader": 0.6}.get(kind, 1.0) * rng.uniform(0.95, 1.05)
    data = 0.03 if kind == "data" else rng.choice((0.0, 0.0005))
    comm = 0.03 if kind == "comm" else 0.004
    rows: list[Row] = []
    for _ in range(config.window):
        c = 0.032 * scale * rng.lognormvariate(0.0, 0.03)
        rows.append((32, c, data, comm, c + data + comm))
    stats = summarize(rows, (), 0.0, config.reference)
    assert stats is not None
    return stats


_SLOW, _NONE = Evidence(12.0, True, 30), Evidence()


@pytest.mark.parametrize("seed", range(10))
def test_windows_judged_together_are_each_judged_alone(seed: int) -> None:
    rng = random.Random(seed)
    config = DetectorConfig(leaders=rng.random() < 0.8)
    judge, ranks = Judge(config), rng.choice((17, 40, 120))
    kinds = ["normal"] * 8 + ["slow", "leader", "data", "comm"]
    verdicts = set()
    for _ in range(6):
        closing = sorted(rng.sample(range(ranks), rng.randint(16, ranks)))
        drawn = [rng.choice(kinds) for _ in closing]
        stats = [_window(rng, config, kind) for kind in drawn]
        links = [rng.choice((None, 0.002, 0.002, 0.2)) for _ in closing]
        evidence = [  # a straggler's evidence says slow; now and then a healthy rank's
            _SLOW if rng.random() < (0.8 if kind == "slow" else 0.05) else _NONE for kind in drawn
        ]
        alone = [
            judge.judge(r, w, e, 3.5, link)
            for r, w, e, link in zip(closing, stats, evidence, links, strict=True)
        ]
        together = judge.judge_many(closing, stats, evidence, 3.5, links)
        assert repr(together) == repr(alone)
        verdicts |= {(j.verdict.value, j.cause.value) for j in together}
        for rank, window, link in zip(closing, stats, links, strict=True):
            judge.queue(rank, window, link)
        judge.renew()
    assert {("normal", "unknown"), ("slow", "compute"), ("slow", "data")} <= verdicts


def test_a_large_jobs_step_as_columns_ends_as_its_events_one_by_one() -> None:
    """40 ranks: their windows close together, judged over arrays; a straggler, a
    leader and a data-bound rank open the incidents they open one event at a time."""
    rng, ranks, t = random.Random(3), 40, 1000.0
    one, batched = JobDetector("big", ranks), JobDetector("big", ranks)
    factor = {3: 2.5, 7: 0.6}
    opened = set()
    for step in range(160):
        rows = []
        for rank in range(ranks):
            compute = 0.032 * factor.get(rank, 1.0) * rng.lognormvariate(0.0, 0.04)
            data = 0.04 if rank == 11 and step > 60 else 0.0005
            step_s = compute + data + 0.005
            rows.append([rank, f"h{rank // 8}", step, 0, 32, t, t + step_s, 32, compute])
            rows[-1] += [data, 0.005, step_s, 0.002]
        t += 0.05
        columns = StepColumns("big", *[list(c) for c in zip(*rows, strict=True)])  # type: ignore[arg-type]
        expected = [i for row in columns.rows() for i in one.ingest_fields(row, t)]  # type: ignore[arg-type]
        found = batched.ingest_step(columns, t)
        said = {(i.rank, i.kind.value, i.state.value, i.cause.value) for i in found}
        assert said == {(i.rank, i.kind.value, i.state.value, i.cause.value) for i in expected}
        assert batched.health(t).ranks == one.health(t).ranks
        opened |= {(rank, kind, cause) for rank, kind, state, cause in said if state == "opened"}
    assert {(3, "slow", "compute"), (7, "leader", "compute"), (11, "slow", "data")} <= opened
