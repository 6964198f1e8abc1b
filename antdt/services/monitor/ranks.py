"""What the detector remembers about each rank, and the health figures built from it.

Pure, no I/O: detector.py owns one RankMemory per rank and moves its incident state
machine; `job_health` reads the ranks' latest closed windows and speed models."""

from __future__ import annotations

import statistics
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, is_not, or_, truediv
from typing import Any, NamedTuple

import numpy as np

from antdt.schemas import (
    ExitReason,
    Incident,
    IncidentKind,
    JobHealth,
    RankColumns,
    RankState,
    trusted,
)
from antdt.services.monitor.config import DetectorConfig
from antdt.services.monitor.history import History
from antdt.services.monitor.judge import Judgement
from antdt.services.monitor.latest import (
    ENDED_AT,
    LINK_RTT_S,
    LOCAL_BATCH,
    SCORE,
    SEEN_AT,
    SETTLE_LEFT,
    SLOW_STEPS,
    STEP,
    WARMUP_LEFT,
    Column,
    Ints,
    LatestSteps,
)
from antdt.services.monitor.openwindows import OpenWindow
from antdt.services.monitor.reference import Evidence
from antdt.services.monitor.speed import SpeedModel
from antdt.services.monitor.windows import WindowStats

#: Steps of a rank's history its speed model is fitted on.
HISTORY_STEPS = 96
#: Normal windows a rank keeps (their step times: the job's pace before an onset).
NORMAL_WINDOWS = 3


def _history() -> History:
    return History(HISTORY_STEPS)


def _open_window() -> OpenWindow:
    return OpenWindow.alone(DetectorConfig().window)


def _normal_step_s() -> deque[float]:
    return deque(maxlen=NORMAL_WINDOWS)


@dataclass(slots=True)
class RankMemory:
    """Everything the detector remembers about one rank."""

    rank: int
    host: str = ""
    # its latest accepted step and its window's close figures (the Columns below): row
    # `latest_row` of the detector's block (alone: a block of its own)
    latest: LatestSteps = field(default_factory=lambda: LatestSteps(1), compare=False, repr=False)
    latest_row: int = 0
    # the open window's figures and the costs before it: a row of the detector's block
    # (alone: a block of its own, the default window's length)
    window: OpenWindow = field(default_factory=_open_window)
    window_plan: int = 0  # plan version of the open window's steps
    stats: WindowStats | None = None  # latest closed window
    judgement: Judgement | None = None  # of the latest closed window
    # its evidence of being slower than the job, read and set as `evidence` (which puts
    # its score in the rank's row too: a step of a job reads whose is not 0 there)
    held_evidence: Evidence = field(default_factory=Evidence)
    # (samples, compute_s) of its recent steps at one speed: its speed model's
    history: History = field(default_factory=_history)
    had_normal: bool = False  # some evaluated window was normal, and looked it
    streak: int = 0  # consecutive deviating windows of `streak_kind`
    streak_kind: IncidentKind | None = None
    normal_streak: int = 0  # consecutive normal windows while an incident is open
    deviation: Incident | None = None  # open SLOW or LEADER incident
    deviation_step: int = 0  # the step it opened at
    deviation_windows: int = 0  # deviating windows in a row of the open incident
    # closed windows in a row whose level was slow_at x the reference or more, whatever
    # their verdict (a slow run's windows before its evidence was in)
    slow_looking: int = 0
    deterministic: bool = False  # the open incident deviated from the start
    stall: Incident | None = None  # open STALLED incident
    exited: ExitReason | None = None  # its process stopped on purpose (RankExit) ...
    exit_step: int = -1  # ... after this step: only a later step means it is back
    started_at: float = 0.0  # when its current process started (RankHello), Unix seconds
    # samples of other ranks' shares it computed under work sharing, by owner, in total
    helped: Counter[int] = field(default_factory=Counter)
    # the median step times of its latest windows judged normal: a communication
    # straggler's step time before its onset
    normal_step_s: deque[float] = field(default_factory=_normal_step_s)
    # its model through the steps around its history's latest change of batch size, and
    # that span (a memo: a round of windows refits the job's fixed part from every rank's)
    span_model: tuple[tuple[int, int, int], SpeedModel | None] | None = None

    @property
    def evidence(self) -> Evidence:
        """Its evidence of being slower than the job."""
        return self.held_evidence

    @evidence.setter
    def evidence(self, evidence: Evidence) -> None:
        self.held_evidence = evidence
        self.latest.views[SCORE][self.latest_row] = evidence[0]  # type: ignore[call-overload]

    last_step = Column[int](STEP, "Its latest accepted step; -1: none yet.")
    last_ended_at = Column[float](ENDED_AT, "When its latest accepted step ended.")
    last_seen_at = Column[float | None](
        SEEN_AT, "Control-plane time of its latest accepted event; None: never.", optional=True
    )
    local_batch = Column[int](LOCAL_BATCH, "Its local batch at its latest accepted step.")
    link_rtt_s = Column[float | None](
        LINK_RTT_S,
        "Its latest round trip to nats-server (StepEvent); None: none heard.",
        optional=True,
    )
    settle_left = Column[int](SETTLE_LEFT, "Steps at a new batch before its evidence counts again.")
    slow_steps = Column[int](SLOW_STEPS, "Slow steps in its open window.")
    warmup_left = Column[int](WARMUP_LEFT, "Measurable windows still to ignore (warm-up).")


@dataclass(frozen=True)
class JobProgress:
    """The job-wide figures a health report carries besides its ranks'."""

    job: str
    at: float
    step: int
    plan_version: int
    open_incidents: tuple[str, ...]


_compute_per_sample = attrgetter("compute_per_sample")
_data_share, _comm_share = attrgetter("data_share"), attrgetter("comm_share")
_latest_row, _latest_of = attrgetter("latest_row"), attrgetter("latest")
_rank_of, _host_of = attrgetter("rank"), attrgetter("host")
_deviation_of, _stall_of = attrgetter("deviation"), attrgetter("stall")
_exited_of, _helped_of = attrgetter("exited"), attrgetter("helped")
#: Models changed, as a share of the ranks, from which a health's model columns are made
#: afresh (after a close every rank's model is new) rather than patched rank by rank.
_REMADE_SHARE = 4
#: A rank's state while an incident of this kind is open (read per such rank per health).
_STATE_OF = {kind: RankState(kind.value) for kind in IncidentKind}
_OK, _UNKNOWN = RankState.OK, RankState.UNKNOWN  # read per rank per health


def median_step_s(ranks: list[RankMemory]) -> float:
    """Median over ranks of their latest window's median step time; 0 before any."""
    steps = [r.stats.step_s for r in ranks if r.stats is not None]
    return statistics.median(steps) if steps else 0.0


class JobFigures(NamedTuple):
    """A health's job-wide figures: made of the ranks' latest closed windows alone."""

    step_s: float
    samples_per_s: float
    balance_efficiency: float


def job_figures(ranks: list[RankMemory]) -> JobFigures:
    """step_s the median of the ranks' step times; samples_per_s one step's samples over
    step_s; balance_efficiency T_ideal / step_s, T_ideal = B / sum(speeds) + min overhead
    + min comm (rebalancing removes neither the data wait nor the communication of the
    rank waited for)."""
    measured = [r.stats for r in ranks if r.stats is not None]
    steps = [s.step_s for s in measured]
    samples = [s.samples for s in measured]
    comm = [s.comm_s for s in measured]
    overhead = [s.overhead_s for s in measured]
    step_s = statistics.median(steps) if measured else 0.0
    batch = sum(samples)
    efficiency = 1.0
    if measured and step_s > 0:
        # each window's samples_per_s, 1.0 / its compute_per_sample, added in rank order
        speed = sum(map(truediv, repeat(1.0), map(_compute_per_sample, measured)))
        ideal = batch / speed + min(overhead)
        ideal += min(comm)
        efficiency = min(1.0, max(0.0, ideal / step_s))
    return JobFigures(step_s, batch / step_s if step_s > 0 else 0.0, efficiency)


def job_health(
    ranks: list[RankMemory],
    progress: JobProgress,
    models: Sequence[SpeedModel | None],
    figures: JobFigures | None = None,
    memo: tuple[ColumnsMemo, int] | None = None,
) -> JobHealth:
    """The job's health from each rank's latest closed window and speed model (`models`,
    by rank; None: not fitted), and the job's `figures` (`job_figures`, made here when
    not given); `memo`, the columns kept from the last health and the count of window
    changes now (`rank_columns`)."""
    if len(models) != len(ranks):
        raise ValueError(f"{len(models)} models for {len(ranks)} ranks")
    job = job_figures(ranks) if figures is None else figures
    return trusted(
        JobHealth,
        {
            "job": progress.job,
            "at": progress.at,
            "step": progress.step,
            "step_s": job.step_s,
            "samples_per_s": job.samples_per_s,
            "balance_efficiency": job.balance_efficiency,
            "plan_version": progress.plan_version,
            "ranks": rank_columns(ranks, models, *(memo or (None, None))),
            "open_incidents": progress.open_incidents,
        },
    )


class ColumnsMemo:
    """A health's columns kept for the next: those of the ranks' latest windows and
    judgements, made at a count of window changes (`windows_at`, the detector's: a
    window closes every W steps, a health comes up to every step), and those of their
    models, made of models the same by identity."""

    __slots__ = ("model_columns", "models", "window_columns", "windows_at")

    def __init__(self) -> None:
        self.windows_at: int | None = None  # None: keep nothing
        self.window_columns: tuple[tuple[Any, ...], ...] | None = None
        self.models: list[SpeedModel | None] = []
        self.model_columns: tuple[tuple[Any, ...], ...] = ((), ())

    def windows(self, ranks: list[RankMemory], at: int | None) -> tuple[tuple[Any, ...], ...]:
        """Per rank, its window's samples_per_s, compute per sample, data and comm
        shares, its judgement's ratio, and its state when no incident or exit says
        otherwise (OK once measured)."""
        if at is None or at != self.windows_at or self.window_columns is None:
            self.windows_at, self.window_columns = at, _window_columns(ranks)
        return self.window_columns

    def of_models(self, models: Sequence[SpeedModel | None]) -> tuple[tuple[Any, ...], ...]:
        """Per rank, its model's fixed_s and per_sample_s (None: no model)."""
        kept = self.models
        if len(kept) != len(models):
            kept = self.models = [None] * len(models)
            self.model_columns = ((None,) * len(models), (None,) * len(models))
        changed = list(compress(range(len(models)), map(is_not, kept, models)))
        if len(changed) * _REMADE_SHARE > len(models):  # after a close: made afresh
            self.models = list(models)
            self.model_columns = (
                tuple([None if m is None else m.fixed_s for m in models]),
                tuple([None if m is None else m.per_sample_s for m in models]),
            )
        elif changed:  # between two closes, a few ranks' alone
            fixed: list[float | None] = list(self.model_columns[0])
            per_sample: list[float | None] = list(self.model_columns[1])
            for i in changed:
                model = kept[i] = models[i]
                fixed[i] = None if model is None else model.fixed_s
                per_sample[i] = None if model is None else model.per_sample_s
            self.model_columns = (tuple(fixed), tuple(per_sample))
        return self.model_columns


def _window_columns(ranks: list[RankMemory]) -> tuple[tuple[Any, ...], ...]:
    """A column per figure, one comprehension each (transposing rows of 10,000 ranks,
    `zip(*rows)`, cost ten times as much); a map over an attrgetter each when every rank
    has a window (the usual health)."""
    stats = [r.stats for r in ranks]
    ratio = tuple(1.0 if r.judgement is None else r.judgement.ratio for r in ranks)
    if None not in stats:
        per_sample = tuple(map(_compute_per_sample, stats))
        return (
            tuple(map(truediv, repeat(1.0), per_sample)),
            per_sample,
            tuple(map(_data_share, stats)),
            tuple(map(_comm_share, stats)),
            ratio,
            (_OK,) * len(stats),
        )
    return (
        tuple(0.0 if s is None else 1.0 / s.compute_per_sample for s in stats),
        tuple(0.0 if s is None else s.compute_per_sample for s in stats),
        tuple(0.0 if s is None else s.data_share for s in stats),
        tuple(0.0 if s is None else s.comm_share for s in stats),
        ratio,
        tuple(_UNKNOWN if s is None else _OK for s in stats),
    )


def _latest_columns(ranks: list[RankMemory]) -> tuple[tuple[int, ...], Ints]:
    """The ranks' local batches and latest steps, read from their rows of the block of
    latest steps (one block: a detector's ranks; else each rank's own)."""
    if not ranks:
        return (), np.zeros(0, dtype=np.int64)
    blocks = set(map(_latest_of, ranks))
    if len(blocks) == 1:
        block = blocks.pop()
        rows = np.fromiter(map(_latest_row, ranks), dtype=np.int64, count=len(ranks))
        return tuple(block.local_batch[rows].tolist()), block.step[rows]
    batch = tuple(r.local_batch for r in ranks)
    return batch, np.array([r.last_step for r in ranks], dtype=np.int64)


def rank_columns(
    ranks: list[RankMemory],
    models: Sequence[SpeedModel | None],
    memo: ColumnsMemo | None = None,
    windows_at: int | None = None,
) -> RankColumns:
    """The ranks' figures as the health's columns, built `trusted`: they are the
    detector's own (shares clamped, speeds positive), and the receiver of the health
    validates them anyway. Each column is made in one comprehension; those of windows
    and models come from `memo` while they hold (`windows_at`: the
    count of window changes now; None: made afresh)."""
    memo = memo or ColumnsMemo()
    rank = tuple(map(_rank_of, ranks))
    host = tuple(map(_host_of, ranks))
    batch, last = _latest_columns(ranks)
    samples_per_s, per_sample, data, comm, ratio, calm = memo.windows(ranks, windows_at)
    fixed_s, per_sample_s = memo.of_models(models)
    helping = compress(ranks, map(bool, map(_helped_of, ranks)))  # seldom any
    helped = {r.rank: dict(r.helped) for r in helping}
    return trusted(
        RankColumns,
        {
            "rank": rank,
            "host": host,
            "state": _states(ranks, calm),
            "last_step": tuple(np.maximum(last, 0).tolist()),
            "local_batch": batch,
            "samples_per_s": samples_per_s,
            "compute_s_per_sample": per_sample,
            "ratio": ratio,
            "data_wait_share": data,
            "comm_share": comm,
            "fixed_s": fixed_s,
            "per_sample_s": per_sample_s,
            "helped": helped or None,
        },
    )


def _states(ranks: list[RankMemory], calm: tuple[RankState, ...]) -> tuple[RankState, ...]:
    """`rank_state` of each rank: `calm` (OK or UNKNOWN) but where an exit, a stall or an
    incident says otherwise."""
    said = list(map(is_not, map(_deviation_of, ranks), repeat(None)))
    incidents_only = True
    for held in (_stall_of, _exited_of):  # seldom any: a pass at C speed each
        others = list(map(is_not, map(held, ranks), repeat(None)))
        if any(others):
            said, incidents_only = list(map(or_, said, others)), False
    if not any(said):
        return calm
    states = list(calm)
    if incidents_only:  # `rank_state` of a rank with an incident alone, written out
        for i in compress(range(len(ranks)), said):
            states[i] = _STATE_OF[ranks[i].deviation.kind]  # type: ignore[union-attr]
    else:
        for i in compress(range(len(ranks)), said):
            states[i] = rank_state(ranks[i])
    return tuple(states)


def rank_state(rank: RankMemory) -> RankState:
    if rank.exited is not None:
        return RankState.RESTARTING if rank.exited is ExitReason.RESTART else RankState.EXITED
    if rank.stall is not None:
        return RankState.STALLED
    if rank.deviation is not None:
        return _STATE_OF[rank.deviation.kind]
    return _OK if rank.stats is not None else _UNKNOWN
