"""The pure part of `antdt report`: a run's recorded messages -> a figure model and table
rows. No I/O, no clock, no matplotlib: plain data in, plain data out."""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, field_validator

from antdt.schemas import (
    MAX_HEALTH_BYTES,
    ActionRecord,
    ActionResult,
    Incident,
    IncidentState,
    RankColumns,
    StepEvent,
)

#: A plan's batches shown one by one in a marker label up to this many ranks.
LABEL_BATCHES = 16
MAX_RANK_LINES = 12  # above this, ranks without incidents are drawn as one median line
INCIDENT_COLOR = "#ff8c00"
RESOLVED_COLOR = "#2e8b57"
ACTION_COLOR = "#d00000"  # applied actions; no rank line uses it
ACTION_OTHER_COLOR = "#808080"  # refused, failed or partial actions
RANK_COLORS = (
    "#1f77b4",
    "#9467bd",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#7f7f7f",
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
)


class HealthPoint(BaseModel):
    """What a report reads of a recorded JobHealth: its time, step and balance efficiency,
    and how many ranks it had (`ranks`, a count: a health of none is left out). Not their
    figures: ANTDT_HEALTH holds hundreds of healths of a large job. A JobHealth passes
    for one."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    #: A JobHealth's size, inflated (its rows grow with the job).
    max_message_bytes: ClassVar[int] = MAX_HEALTH_BYTES

    job: str
    at: float
    step: int
    balance_efficiency: float
    ranks: int

    @field_validator("ranks", mode="before")
    @classmethod
    def _counted(cls, ranks: object) -> object:
        """The ranks counted as they are read, their figures dropped: the columns (or a
        JobHealth's), or rows (a health of before 2026-12-01)."""
        if isinstance(ranks, dict):
            ranks = ranks.get("rank")
        return len(ranks) if isinstance(ranks, list | tuple | RankColumns) else ranks


@dataclass
class RunRecord:
    """What was recorded for one job (any order; the builder sorts)."""

    job: str
    steps: list[StepEvent] = field(default_factory=list)
    health: list[HealthPoint] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    actions: list[ActionRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RankSeries:
    """One line per rank (or the median of the ranks not drawn one by one)."""

    label: str
    color: str
    steps: tuple[int, ...]
    busy_s: tuple[float, ...]  # compute + data wait: the time before the barrier
    per_sample_ms: tuple[float, ...]  # compute per sample (nan when no samples)
    local_batch: tuple[int, ...]


@dataclass(frozen=True)
class Marker:
    """A vertical marker: an incident transition or an action, at a step."""

    step: float
    kind: str  # "incident" | "action"
    label: str
    ref: str  # incident id or action id
    color: str


@dataclass(frozen=True)
class Timeline:
    job: str
    ranks: tuple[RankSeries, ...]
    step_wall: tuple[tuple[int, float], ...]  # (step, wall seconds of the step)
    efficiency: tuple[tuple[int, float], ...]  # (step, balance efficiency)
    markers: tuple[Marker, ...]
    incident_rows: tuple[dict[str, str], ...]
    action_rows: tuple[dict[str, str], ...]
    summary: dict[str, str]
    notes: tuple[str, ...] = ()


def build_timeline(record: RunRecord) -> Timeline:
    steps = sorted((e for e in record.steps if e.job == record.job), key=lambda e: (e.step, e.rank))
    health = sorted((h for h in record.health if h.job == record.job and h.ranks), key=_at)
    incidents = sorted(record.incidents, key=lambda i: (i.updated_at, i.id))
    actions = sorted(record.actions, key=lambda a: (a.decided_at, a.action_id))
    clock = step_clock(steps)
    return Timeline(
        job=record.job,
        ranks=tuple(rank_series(steps, _flagged_ranks(incidents))),
        step_wall=tuple(step_walls(steps)),
        efficiency=tuple((h.step, h.balance_efficiency) for h in health),
        # actions first: the figure labels the first markers only (figure.MAX_LABELS)
        markers=tuple(action_markers(actions, clock) + incident_markers(incidents)),
        incident_rows=tuple(incident_rows(incidents)),
        action_rows=tuple(action_rows(actions)),
        summary=summarize(record.job, steps, health, incidents, actions),
        notes=tuple(record.notes),
    )


def _at(h: HealthPoint) -> float:
    return h.at


def _flagged_ranks(incidents: list[Incident]) -> set[int]:
    return {i.rank for i in incidents}


def rank_series(steps: list[StepEvent], flagged: set[int]) -> list[RankSeries]:
    by_rank: dict[int, list[StepEvent]] = defaultdict(list)
    for event in steps:
        by_rank[event.rank].append(event)
    shown, rest = pick_ranks(sorted(by_rank), flagged)
    series = [
        _series(f"rank {r}", RANK_COLORS[i % len(RANK_COLORS)], by_rank[r])
        for i, r in enumerate(shown)
    ]
    if rest:
        series.append(_median_series(f"median of {len(rest)} other ranks", rest, by_rank))
    return series


def pick_ranks(ranks: list[int], flagged: set[int]) -> tuple[list[int], list[int]]:
    """Ranks drawn one by one (those with incidents first) and the rest (one median line)."""
    if len(ranks) <= MAX_RANK_LINES:
        return ranks, []
    room = MAX_RANK_LINES - 1
    shown = [r for r in ranks if r in flagged][:room]
    shown += [r for r in ranks if r not in flagged][: room - len(shown)]
    return sorted(shown), [r for r in ranks if r not in shown]


def _per_sample_ms(event: StepEvent) -> float:
    return 1000.0 * event.compute_s / event.samples if event.samples else float("nan")


def _series(label: str, color: str, events: list[StepEvent]) -> RankSeries:
    return RankSeries(
        label=label,
        color=color,
        steps=tuple(e.step for e in events),
        busy_s=tuple(e.compute_s + e.data_wait_s for e in events),
        per_sample_ms=tuple(_per_sample_ms(e) for e in events),
        local_batch=tuple(e.local_batch for e in events),
    )


def _median_series(label: str, ranks: list[int], by_rank: dict[int, list[StepEvent]]) -> RankSeries:
    per_step: dict[int, list[StepEvent]] = defaultdict(list)
    for rank in ranks:
        for event in by_rank[rank]:
            per_step[event.step].append(event)
    order = sorted(per_step)

    def med(values: list[float]) -> float:
        finite = [v for v in values if v == v]
        return statistics.median(finite) if finite else float("nan")

    return RankSeries(
        label=label,
        color="#000000",
        steps=tuple(order),
        busy_s=tuple(med([e.compute_s + e.data_wait_s for e in per_step[s]]) for s in order),
        per_sample_ms=tuple(med([_per_sample_ms(e) for e in per_step[s]]) for s in order),
        local_batch=tuple(int(med([float(e.local_batch) for e in per_step[s]])) for s in order),
    )


def robust_top(values: list[float], *, q: float = 0.98, pad: float = 1.4) -> float | None:
    """An upper axis limit that one outlier (a GC pause, a host hiccup) cannot squash the
    picture with: the q-quantile times `pad`, or None (no limit) when nothing sticks out."""
    finite = sorted(v for v in values if v == v)
    if len(finite) < 20:
        return None
    top = finite[min(len(finite) - 1, int(q * len(finite)))] * pad
    return top if finite[-1] > top > 0 else None


def step_walls(steps: list[StepEvent]) -> list[tuple[int, float]]:
    """The job's wall time per step: the longest rank's (under BSP they all wait for it)."""
    walls: dict[int, float] = {}
    for event in steps:
        walls[event.step] = max(walls.get(event.step, 0.0), event.step_s)
    return sorted(walls.items())


@dataclass(frozen=True)
class StepClock:
    """Maps wall-clock time to a (fractional) step from the steps' end times."""

    ends: tuple[float, ...]
    steps: tuple[int, ...]

    def step_at(self, t: float) -> float:
        if not self.ends:
            return 0.0
        i = bisect.bisect_left(self.ends, t)
        if i == 0:
            return float(self.steps[0])
        if i == len(self.ends):
            return float(self.steps[-1])
        t0, t1, s0, s1 = self.ends[i - 1], self.ends[i], self.steps[i - 1], self.steps[i]
        return s0 + (s1 - s0) * (t - t0) / (t1 - t0) if t1 > t0 else float(s1)


def step_clock(steps: list[StepEvent]) -> StepClock:
    ends: dict[int, float] = {}
    for event in steps:
        ends[event.step] = min(ends.get(event.step, event.ended_at), event.ended_at)
    pairs = sorted((t, s) for s, t in ends.items())
    return StepClock(tuple(t for t, _ in pairs), tuple(s for _, s in pairs))


def incident_markers(incidents: list[Incident]) -> list[Marker]:
    """One marker per (incident, state) at the step the state was reached."""
    seen: set[tuple[str, str]] = set()
    out = []
    for inc in incidents:
        key = (inc.id, inc.state.value)
        if key in seen:
            continue
        seen.add(key)
        resolved = inc.state == IncidentState.RESOLVED
        label = f"r{inc.rank} {inc.kind.value}/{inc.straggler_class.value} {inc.state.value}"
        color = RESOLVED_COLOR if resolved else INCIDENT_COLOR
        out.append(Marker(float(inc.step), "incident", label, inc.id, color))
    return out


def action_markers(actions: list[ActionRecord], clock: StepClock) -> list[Marker]:
    """Actions at their effective step (or, for those never applied, when decided)."""
    out = []
    for action in actions:
        step = (
            float(action.effective_step)
            if action.effective_step is not None
            else clock.step_at(action.decided_at)
        )
        applied = action.result == ActionResult.APPLIED
        label = f"{action.kind} {_batch_label(action.local_batch)} {action.result.value}"
        label = label.replace("  ", " ")
        color = ACTION_COLOR if applied else ACTION_OTHER_COLOR
        out.append(Marker(step, "action", label, action.action_id, color))
    return out


def _batch_label(batches: tuple[int, ...] | None) -> str:
    """A plan's batches as a marker label shows them: each while they are few, else their
    range (a 10,000-rank plan's list was a 40,000-character label across the figure)."""
    if not batches:
        return ""
    if len(batches) <= LABEL_BATCHES:
        return str(list(batches))
    return f"{min(batches)}-{max(batches)} over {len(batches):,} ranks"


def incident_rows(incidents: list[Incident]) -> list[dict[str, str]]:
    """One row per incident id: its last state and the path it took."""
    by_id: dict[str, list[Incident]] = defaultdict(list)
    for inc in incidents:
        by_id[inc.id].append(inc)
    rows = []
    for inc_id, states in sorted(by_id.items(), key=lambda kv: kv[1][0].opened_at):
        last = states[-1]
        path, seen = [], set()
        for s in states:
            if s.state.value not in seen:
                seen.add(s.state.value)
                path.append(f"{s.state.value}@{s.step}")
        rows.append(
            {
                "incident": inc_id,
                "rank": str(last.rank),
                "host": last.host,
                "kind": last.kind.value,
                "class": last.straggler_class.value,
                "cause": last.cause.value,
                "state": last.state.value,
                "path": " → ".join(path),
                "max ratio": f"{max(s.ratio for s in states):.2f}",
            }
        )
    return rows


def action_rows(actions: list[ActionRecord]) -> list[dict[str, str]]:
    return [
        {
            "action": a.action_id,
            "kind": a.kind,
            "policy": a.policy,
            "result": a.result.value,
            "incident": a.incident_id or "",
            "plan": "" if a.plan_version is None else f"v{a.plan_version}",
            "local batch": " ".join(str(b) for b in a.local_batch or ()),
            "effective step": "" if a.effective_step is None else str(a.effective_step),
            "acked": " ".join(str(r) for r in a.acked_ranks),
            "reason": a.reason,
            "error": a.error or "",
        }
        for a in actions
    ]


def summarize(
    job: str,
    steps: list[StepEvent],
    health: list[HealthPoint],
    incidents: list[Incident],
    actions: list[ActionRecord],
) -> dict[str, str]:
    step_ids = sorted({e.step for e in steps})
    duration = max((e.ended_at for e in steps), default=0.0) - min(
        (e.started_at for e in steps), default=0.0
    )
    effs = [h.balance_efficiency for h in health]
    applied = sum(1 for a in actions if a.result == ActionResult.APPLIED)
    return {
        "job": job,
        "ranks": str(len({e.rank for e in steps})),
        "steps": f"{step_ids[0]}-{step_ids[-1]}" if step_ids else "none recorded",
        "duration": f"{duration:.1f} s",
        "median efficiency": f"{statistics.median(effs):.2f}" if effs else "n/a",
        "incidents": str(len({i.id for i in incidents})),
        "actions applied / recorded": f"{applied} / {len(actions)}",
    }
