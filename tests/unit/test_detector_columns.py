"""`JobDetector.ingest_step` (a step of many ranks as columns) against `ingest_fields`
(one event at a time): the same random streams, with stragglers, a slow host, a new plan,
missing ranks, late, duplicate and poisoned rows, give the same incidents, health and
rejections, step by step (a step's windows close together there: its transitions may
come in another order, and take other ids); a health's per-window figures, made once
per window; a step's events in any order, the same verdicts."""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable

import numpy as np
import pytest

from antdt.schemas import Incident, JobHealth
from antdt.services.monitor import JobDetector
from antdt.services.monitor.ranks import RankMemory
from antdt.services.monitor.reference import ReferenceConfig
from antdt.services.monitor.stepcolumns import StepColumns, all_acceptable, arrays_of
from antdt.services.monitor.windows import summarize

JOB = "columns"
MANY_CLOSES = 16
RANKS, PER_HOST, STEPS = 12, 4, 140


def _stream(
    seed: int, rtt: bool, one_piece: bool = False, ranks: int = RANKS, missing: float = 0.07
) -> list[tuple[float, StepColumns]]:
    """Steps of a job with two stragglers, a host slowing later, a plan halving one
    rank's batch; each step's rows shuffled, some ranks missing (each row with chance
    `missing`), some rows bad; with `one_piece`, some rows judged by a one-pass time
    (work sharing), a few of them bad."""
    rng = random.Random(seed)
    slow = dict.fromkeys(rng.sample(range(ranks), 2), rng.uniform(1.8, 3.0))
    slow_host, host_onset = rng.randrange(ranks // PER_HOST), rng.randrange(40, 90)
    replan_at, halved = rng.randrange(30, 100), rng.randrange(ranks)
    last: dict[int, tuple[int, float]] = {}
    t, stream = 1000.0, []
    for step in range(STEPS):
        rows = []
        plan = int(step >= replan_at)
        for rank in range(ranks):
            if rng.random() < missing:
                continue  # missing this step: its event never came
            batch = 16 if plan and rank == halved else 32
            factor = slow.get(rank, 1.0) if step > 20 else 1.0
            if rank // PER_HOST == slow_host and step >= host_onset:
                factor *= 1.6
            compute = (0.004 + 0.001 * batch) * factor * rng.lognormvariate(0.0, 0.05)
            step_s = compute + 0.006
            row = [rank, f"h{rank // PER_HOST}", step, plan, batch, t, t + step_s, batch]
            rows.append([*row, compute, 0.0005, 0.005, step_s, rng.uniform(0.004, 0.006)])
            last[rank] = (step, t)
        for rank, (then, at) in list(last.items())[: rng.choice((0, 0, 0, 1, 2))]:
            # a late row (an earlier step), or a duplicate of this step's
            rows.append([rank, f"h{rank // PER_HOST}", then - rng.randint(0, 1), 0, 32, at])
            rows[-1] += [at + 0.04, 32, 0.04, 0.0, 0.005, 0.045, 0.005]
        if rng.random() < 0.05 and rows:
            rows[rng.randrange(len(rows))][rng.choice((8, 9, 11))] = rng.choice(
                (float("nan"), -1.0, float("inf"))
            )
        rng.shuffle(rows)
        t += 0.05
        cols = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in range(13)]
        if not rtt:
            cols[-1] = None  # type: ignore[call-overload]
        if one_piece:
            cols.append([_one_piece(rng, row[8]) for row in rows])
        stream.append((t, StepColumns(JOB, *cols)))  # type: ignore[arg-type]
    return stream


def _one_piece(rng: random.Random, compute: float) -> float | None:
    draw = rng.random()
    if draw < 0.01:
        return float("nan")
    return compute * rng.uniform(0.8, 1.2) if draw < 0.3 else None


@pytest.mark.parametrize(
    ("seed", "rtt", "one_piece"),
    [
        (1, True, False),
        (2, False, False),
        (3, True, False),
        (4, False, False),
        (5, True, True),  # some rows judged by a one-pass time
        (6, False, True),
    ],
)
def test_a_step_as_columns_is_its_events_one_by_one(seed: int, rtt: bool, one_piece: bool) -> None:
    one, batched = JobDetector(JOB, RANKS), JobDetector(JOB, RANKS)
    bulk = 0
    for now, columns in _stream(seed, rtt, one_piece):
        arrays = arrays_of(columns)
        bulk += arrays is not None and all_acceptable(columns, arrays, batched._latest, JOB)
        expected = [t for row in columns.rows() for t in one.ingest_fields(row, now)]  # type: ignore[arg-type]
        assert _as_said(batched.ingest_step(columns, now)) == _as_said(expected)
        assert _same_health(batched.health(now), one.health(now))
    assert batched.rejected == one.rejected and sum(one.rejected.values()) > 0
    assert _as_said(batched.open_incidents) == _as_said(one.open_incidents) != []
    assert batched.discarded_windows == one.discarded_windows
    assert 0 < bulk < STEPS  # both paths taken: screened in bulk, and row by row
    health = batched.health(now)  # its rows built unvalidated: they pass the wire's checks
    assert JobHealth.model_validate_json(health.model_dump_json()) == health


@pytest.mark.parametrize(
    ("seed", "one_piece", "arrays"), [(11, False, False), (12, True, False), (13, True, True)]
)
def test_a_step_of_many_ranks_is_its_events_one_by_one(
    seed: int, one_piece: bool, arrays: bool
) -> None:
    """Enough ranks that a step's windows close at once (closes.py) and are judged over
    arrays: the same transitions, health, and every rank's memory, step by step; with
    `arrays`, the numeric columns given as numpy arrays (a simulator's), which leave
    Python numbers in the memories."""
    ranks = 4 * MANY_CLOSES  # a step's closes many, judged over arrays (judge._MANY: 16)
    one, batched = JobDetector(JOB, ranks), JobDetector(JOB, ranks)
    closes_at_once = 0
    for now, columns in _stream(seed, True, one_piece, ranks=ranks, missing=0.003):
        if arrays:
            columns = _as_arrays(columns)
        expected = [t for row in columns.rows() for t in one.ingest_fields(row, now)]  # type: ignore[arg-type]
        full = sum(len(r.window) == one.config.window - 1 for r in batched._ranks)
        closes_at_once += full >= MANY_CLOSES
        assert _as_said(batched.ingest_step(columns, now)) == _as_said(expected)
        assert _same_health(batched.health(now), one.health(now))
        assert list(map(_memory, batched._ranks)) == list(map(_memory, one._ranks))
    assert _as_said(batched.open_incidents) == _as_said(one.open_incidents) != []
    assert closes_at_once >= 5
    numbers = [
        (r.last_step, r.local_batch, r.last_ended_at, *r.window.costs_before())
        for r in batched._ranks
    ]
    assert {type(x) for row in numbers for x in row} == {int, float}


def _as_arrays(columns: StepColumns) -> StepColumns:
    """The step's numeric columns as numpy arrays (of ints where they are all ints)."""
    numeric = [np.asarray(c) for c in columns[1:13]]
    numeric[1] = columns.host  # type: ignore[call-overload]
    return StepColumns(columns.job, *numeric, columns.link_rtt_s, columns.one_piece_s)  # type: ignore[arg-type]


LATEST = ("last_step", "last_ended_at", "last_seen_at", "local_batch", "link_rtt_s", "settle_left")


def _memory(rank: RankMemory) -> dict[str, object]:
    """What a rank's memory holds but its memos and its history (a row of a block)."""
    memos = {"history", "model", "span_model", "deviation", "stall", "latest"}
    held = {k: getattr(rank, k) for k in RankMemory.__dataclass_fields__ if k not in memos}
    for k in LATEST:  # its row of the detector's block of latest steps
        held[k] = getattr(rank, k)
    held["normal_step_s"] = list(rank.normal_step_s)
    held["history"] = list(rank.history)
    for kind in ("deviation", "stall"):
        incident = getattr(rank, kind)
        held[kind] = None if incident is None else incident.model_dump(exclude={"id"})
    return held


def test_steps_of_another_job_or_with_no_rows_change_nothing() -> None:
    detector = JobDetector(JOB, 2)
    row = [[0], ["h0"], [0], [0], [32], [1.0], [1.04], [32], [0.04], [0.0], [0.0], [0.04]]
    assert detector.ingest_step(StepColumns("other", *row), 2.0) == []  # type: ignore[arg-type]
    empty = StepColumns(JOB, *([] for _ in range(12)))  # type: ignore[arg-type]
    assert detector.ingest_step(empty, 2.0) == []
    assert detector.rejected == {"wrong_job": 1}
    assert detector._ranks[0].last_step == -1  # nothing remembered


def test_a_windows_step_figures_are_its_medians() -> None:
    """What a health and the stall limit read of each rank's window: the medians of its
    steps' times, samples, comm times and overheads (not below 0)."""
    rng = random.Random(5)
    for _ in range(50):
        rows = [
            (rng.choice((0, 16, 32)), rng.uniform(0.0, 0.05), rng.uniform(0.0, 0.01), m, s)
            for m, s in ((rng.uniform(0.0, 0.02), rng.uniform(0.0, 0.1)) for _ in range(8))
        ][: rng.choice((7, 8))]
        stats = summarize(rows, (), 0.0, ReferenceConfig())
        if stats is None:
            continue
        medians = [statistics.median(column) for column in list(zip(*rows, strict=True))[::-1]]
        overhead = statistics.median(max(0.0, s - c - m) for _, c, _, m, s in rows)
        expected = (medians[0], medians[4], medians[1], overhead, len(rows))
        found = (stats.step_s, stats.samples, stats.comm_s, stats.overhead_s, stats.events)
        assert repr(found) == repr(expected)


def test_ranks_that_moved_stalled_or_exited_are_accepted_from_columns_as_one_by_one() -> None:
    """A step screened in bulk may hold rows of ranks with something to resolve: one
    moved to another host, one back from a stall, one back after it exited to be
    restarted. Those rows take the long way; the detector ends the same as one by one."""
    from antdt.schemas import ExitReason, RankExit
    from antdt.services.monitor import DetectorConfig

    config = DetectorConfig(min_stall_s=0.3)
    one, batched = JobDetector(JOB, RANKS, config), JobDetector(JOB, RANKS, config)
    rng, t, seen = random.Random(7), 1000.0, set()
    for step in range(120):
        t += 0.05
        if step == 50:
            leaving = RankExit(
                job=JOB, rank=5, host="h1", pid=1, reason=ExitReason.RESTART, step=49, at=t
            )
            assert batched.rank_exited(leaving, t) == one.rank_exited(leaving, t)
        rows = []
        for rank in range(RANKS):
            if (rank == 2 and 30 <= step < 45) or (rank == 5 and 50 <= step < 56):
                continue  # silent: rank 2 stalls, rank 5 restarts
            host = "h9" if rank == 7 and step >= 70 else f"h{rank // PER_HOST}"
            factor = 2.5 if rank == 3 and step > 20 else 1.0
            compute = 0.036 * factor * rng.lognormvariate(0.0, 0.05)
            rows.append([rank, host, step, 0, 32, t, t + compute + 0.006, 32, compute])
            rows[-1] += [0.0005, 0.005, compute + 0.006, 0.005]
        columns = StepColumns(JOB, *[list(c) for c in zip(*rows, strict=True)])  # type: ignore[arg-type]
        arrays = arrays_of(columns)
        assert arrays is not None and all_acceptable(columns, arrays, batched._latest, JOB)
        expected = [i for row in columns.rows() for i in one.ingest_fields(row, t)]  # type: ignore[arg-type]
        assert _as_said(batched.ingest_step(columns, t)) == _as_said(expected)
        stalls = one.check_stalls(t)
        assert _as_said(batched.check_stalls(t)) == _as_said(stalls)
        assert _same_health(batched.health(t), one.health(t))
        seen.update((i.rank, i.kind.value, i.state.value) for i in [*expected, *stalls])
    assert _as_said(batched.open_incidents) == _as_said(one.open_incidents) != []
    assert {(2, "stalled", "opened"), (2, "stalled", "resolved")} <= seen
    assert batched._ranks[7].host == "h9"


def _as_said(incidents: Iterable[Incident]) -> list[str]:
    """Each incident's latest word in `incidents`, without its id (a sequence number:
    the order incidents opened in). A SLOW incident opening beside another on its host
    is sent again with the hosts named: which one comes twice is the order's."""
    latest = {(i.rank, i.kind): i for i in incidents}
    return sorted(i.model_dump_json(exclude={"id"}) for i in latest.values())


def _same_health(a: JobHealth, b: JobHealth) -> bool:
    """The same health but the open incidents' ids."""
    ids = {"open_incidents"}
    same = a.model_dump(exclude=ids) == b.model_dump(exclude=ids)
    return same and len(a.open_incidents) == len(b.open_incidents)


@pytest.mark.parametrize("seed", range(4))
def test_a_steps_events_in_any_order_give_the_same_verdicts(seed: int) -> None:
    """Every window closing in a step is judged against the job's figures as the step
    began, so the order a step's events arrive in (the network's) changes nothing: the
    same incidents open and resolve at the same steps, with the same figures, and the
    same health, whether a step's rows come in order or shuffled."""
    rng = random.Random(seed)
    ordered, shuffled = JobDetector(JOB, RANKS), JobDetector(JOB, RANKS)
    seen = 0
    for now, columns in _stream(seed, rtt=True):
        step = max(columns.step, default=0)
        # the step's own rows, one a rank (the stream's late and duplicate rows: the
        # first to come wins by design)
        rows = sorted({r[1]: r for r in columns.rows() if r[3] == step}.values(), key=repr)
        mixed = rng.sample(rows, len(rows))
        expected = [t for row in rows for t in ordered.ingest_fields(row, now)]  # type: ignore[arg-type]
        found = [t for row in mixed for t in shuffled.ingest_fields(row, now)]  # type: ignore[arg-type]
        assert _as_said(found) == _as_said(expected)
        assert shuffled.health(now).ranks == ordered.health(now).ranks
        seen += len(expected)
    assert _as_said(shuffled.open_incidents) == _as_said(ordered.open_incidents)
    assert seen > 0
