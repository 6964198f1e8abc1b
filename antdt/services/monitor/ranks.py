"""What the detector remembers about each rank, and the health figures built from it.

Pure, no I/O: detector.py owns one RankMemory per rank and moves its incident state
machine; `job_health` reads the ranks' latest closed windows."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from antdt.schemas import ExitReason, Incident, IncidentKind, JobHealth, RankHealth, RankState
from antdt.services.monitor.judge import Judgement
from antdt.services.monitor.windows import Row, WindowStats


@dataclass(slots=True)
class RankMemory:
    """Everything the detector remembers about one rank."""

    rank: int
    host: str = ""
    last_step: int = -1  # -1: no event yet
    last_ended_at: float = 0.0
    last_seen_at: float | None = None  # control-plane time of its latest accepted event
    local_batch: int = 0
    window: list[Row] = field(default_factory=list)  # the open window's figures
    window_plan: int = 0  # plan version of the open window's steps
    warmup_left: int = 0  # measurable windows still to ignore (warm-up)
    stats: WindowStats | None = None  # latest closed window
    judgement: Judgement | None = None  # of the latest closed window
    had_normal: bool = False  # some evaluated window was normal
    streak: int = 0  # consecutive deviating windows of `streak_kind`
    streak_kind: IncidentKind | None = None
    normal_streak: int = 0  # consecutive normal windows while an incident is open
    deviation: Incident | None = None  # open SLOW or LEADER incident
    deviation_windows: int = 0  # deviating windows of the open incident
    deterministic: bool = False  # the open incident deviated from the start
    stall: Incident | None = None  # open STALLED incident
    exited: ExitReason | None = None  # its process stopped on purpose (RankExit) ...
    exit_step: int = -1  # ... after this step: only a later step means it is back
    started_at: float = 0.0  # when its current process started (RankHello), Unix seconds


@dataclass(frozen=True)
class JobProgress:
    """The job-wide figures a health report carries besides its ranks'."""

    job: str
    at: float
    step: int
    plan_version: int
    open_incidents: tuple[str, ...]


def median_step_s(ranks: list[RankMemory]) -> float:
    """Median over ranks of their latest window's median step time; 0 before any."""
    steps = [r.stats.step_s for r in ranks if r.stats is not None]
    return statistics.median(steps) if steps else 0.0


def job_health(ranks: list[RankMemory], progress: JobProgress) -> JobHealth:
    """The job's health from each rank's latest closed window: step_s the median of the
    ranks' step times; samples_per_s one step's samples over step_s; balance_efficiency
    T_ideal / step_s, T_ideal = B / sum(speeds) + min overhead + min comm (rebalancing
    removes neither the data wait nor the communication of the rank waited for)."""
    measured = [r.stats for r in ranks if r.stats is not None]
    step_s = statistics.median(s.step_s for s in measured) if measured else 0.0
    batch = sum(s.samples for s in measured)
    efficiency = 1.0
    if measured and step_s > 0:
        speed = sum(s.samples_per_s for s in measured)
        ideal = batch / speed + min(s.overhead_s for s in measured)
        ideal += min(s.comm_s for s in measured)
        efficiency = min(1.0, max(0.0, ideal / step_s))
    return JobHealth(
        job=progress.job,
        at=progress.at,
        step=progress.step,
        step_s=step_s,
        samples_per_s=batch / step_s if step_s > 0 else 0.0,
        balance_efficiency=efficiency,
        plan_version=progress.plan_version,
        ranks=tuple(rank_health(r) for r in ranks),
        open_incidents=progress.open_incidents,
    )


def rank_state(rank: RankMemory) -> RankState:
    if rank.exited is not None:
        return RankState.RESTARTING if rank.exited is ExitReason.RESTART else RankState.EXITED
    if rank.stall is not None:
        return RankState.STALLED
    if rank.deviation is not None:
        return RankState(rank.deviation.kind.value)
    return RankState.OK if rank.stats is not None else RankState.UNKNOWN


def rank_health(rank: RankMemory) -> RankHealth:
    stats = rank.stats
    return RankHealth(
        rank=rank.rank,
        host=rank.host,
        state=rank_state(rank),
        last_step=max(rank.last_step, 0),
        local_batch=rank.local_batch,
        samples_per_s=stats.samples_per_s if stats else 0.0,
        compute_s_per_sample=stats.compute_per_sample if stats else 0.0,
        ratio=rank.judgement.ratio if rank.judgement else 1.0,
        data_wait_share=stats.data_share if stats else 0.0,
        comm_share=stats.comm_share if stats else 0.0,
    )
