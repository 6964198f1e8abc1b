"""A rank's deviation incident (slow or leader), moved on by each judged window (pure).

Opens after `open_windows` deviating windows in a row, or at once on a strong one (a
compute straggler's: its evidence is enough, and may open one between windows too,
`open_slow`); escalates to persistent after `persistent_windows` deviating windows in a
row (a window that looks normal, fading or not, starts the count again); resolves after
`resolve_windows` normal windows in a row. docs/architecture.md (the monitor) gives the
rules and why."""

from __future__ import annotations

from antdt.schemas import Incident, IncidentKind, IncidentState, StragglerClass
from antdt.services.monitor.config import DetectorConfig
from antdt.services.monitor.judge import Judgement, Verdict
from antdt.services.monitor.openincidents import OpenIncidents
from antdt.services.monitor.ranks import RankMemory
from antdt.services.monitor.windows import WindowStats


def advance(
    rank: RankMemory,
    judged: Judgement,
    step: int,
    now: float,
    config: DetectorConfig,
    book: OpenIncidents,
) -> list[Incident]:
    """Move the rank's incident state machine by one closed window: its transitions."""
    if judged.verdict is Verdict.UNEVALUATED:
        return []
    if judged.verdict is Verdict.FADING:
        # Neither way for opening or resolving (the evidence lags the rank's pace), but
        # the slow run is broken: two bursts with a normal pace between are not one.
        rank.deviation_windows = 0
        return []
    if judged.verdict is Verdict.NORMAL:
        return _normal_window(rank, judged, step, now, config, book)
    kind = IncidentKind.SLOW if judged.verdict is Verdict.SLOW else IncidentKind.LEADER
    transitions = []
    if rank.deviation is not None and _turned(rank.deviation, kind, judged):
        transitions.append(_resolve(rank, judged, step, now, config, book))
    if rank.streak_kind != kind:
        rank.streak_kind, rank.streak = kind, 0
    rank.streak += 1
    rank.normal_streak = 0
    if rank.deviation is None:
        if rank.streak < config.open_windows and not judged.strong:
            return transitions
        transitions.append(_open(rank, kind, judged, step, now, book))
    else:
        rank.deviation_windows += 1
    escalation = _maybe_escalate(rank, judged, step, now, config)
    return transitions + ([escalation] if escalation else [])


def _turned(incident: Incident, kind: IncidentKind, judged: Judgement) -> bool:
    """The open incident no longer says what the rank suffers: another kind, or a strong
    window of another cause (a rank whose data slowed while a compute incident was open
    needs the data remedy; only a strong window moves it, so a mixed rank does not flap)."""
    if incident.kind != kind:
        return True
    return judged.strong and judged.cause != incident.cause


def open_slow(
    rank: RankMemory,
    judged: Judgement,
    windows: int,
    step: int,
    now: float,
    config: DetectorConfig,
    book: OpenIncidents,
) -> list[Incident]:
    """The rank's evidence turned slow between windows: its SLOW incident opens now (a
    LEADER one resolves first), counting `windows` closed windows of its slow run (the
    open window counts when it closes)."""
    transitions = []
    if rank.deviation is not None:
        if rank.deviation.kind is IncidentKind.SLOW:
            return []
        transitions.append(_resolve(rank, judged, step, now, config, book))
    rank.streak_kind = IncidentKind.SLOW
    rank.streak = windows
    rank.normal_streak = 0
    transitions.append(_open(rank, IncidentKind.SLOW, judged, step, now, book))
    return transitions


def _normal_window(
    rank: RankMemory,
    judged: Judgement,
    step: int,
    now: float,
    config: DetectorConfig,
    book: OpenIncidents,
) -> list[Incident]:
    _count_normal(rank, judged, config)
    if rank.deviation is None:
        return []
    rank.deviation_windows = 0
    rank.normal_streak += 1
    if rank.normal_streak < config.resolve_windows:
        return []
    return [_resolve(rank, judged, step, now, config, book)]


def _count_normal(rank: RankMemory, judged: Judgement, config: DetectorConfig) -> None:
    # A window counts as normal for the class only when it looked normal itself: a
    # mild straggler from the start is normal to its evidence until the evidence is in.
    rank.had_normal = rank.had_normal or judged.ratio < 1.0 + config.slow_threshold
    rank.streak_kind, rank.streak = None, 0


def _open(
    rank: RankMemory,
    kind: IncidentKind,
    judged: Judgement,
    step: int,
    now: float,
    book: OpenIncidents,
) -> Incident:
    # A rank that deviated before any of its windows looked normal is built that way
    # (hardware), not suffering contention: the streak started with no normal window.
    rank.deterministic = not rank.had_normal
    rank.deviation_windows = rank.streak
    rank.deviation_step = step
    rank.deviation = Incident(
        id=book.new_id(rank.rank, kind),
        job=book.job,
        rank=rank.rank,
        host=rank.host,
        kind=kind,
        straggler_class=(
            StragglerClass.DETERMINISTIC if rank.deterministic else StragglerClass.UNKNOWN
        ),
        cause=judged.cause,
        state=IncidentState.OPENED,
        step=step,
        opened_at=now,
        updated_at=now,
        ratio=judged.ratio,
        windows=rank.deviation_windows,
        evidence=judged.evidence(rank.deviation_windows),
    )
    return book.opened(rank.deviation)


def _maybe_escalate(
    rank: RankMemory, judged: Judgement, step: int, now: float, config: DetectorConfig
) -> Incident | None:
    incident = rank.deviation
    if (
        incident is None
        or rank.deterministic
        or incident.straggler_class is StragglerClass.PERSISTENT
        or rank.deviation_windows < config.persistent_windows
    ):
        return None
    # Escalation is the signal for heavier action (KILL_RESTART), so it is emitted
    # even while a lighter mitigation is under way.
    rank.deviation = incident.model_copy(
        update={
            **_window_figures(judged, rank, step, now),
            "state": IncidentState.ESCALATED,
            "straggler_class": StragglerClass.PERSISTENT,
        }
    )
    return rank.deviation


def _resolve(
    rank: RankMemory,
    judged: Judgement,
    step: int,
    now: float,
    config: DetectorConfig,
    book: OpenIncidents,
) -> Incident:
    incident = rank.deviation
    assert incident is not None
    if rank.deterministic:
        klass = StragglerClass.DETERMINISTIC
    elif (
        incident.straggler_class is StragglerClass.PERSISTENT
        or rank.deviation_windows >= config.persistent_windows
    ):
        klass = StragglerClass.PERSISTENT
    else:
        klass = StragglerClass.TRANSIENT
    figures = _window_figures(judged, rank, step, now)
    resolved = book.closed(incident, now, **figures, straggler_class=klass)
    forget_deviation(rank)
    return resolved


def forget_deviation(rank: RankMemory) -> None:
    """The rank's deviation incident is closed: its counts start over."""
    rank.deviation = None
    rank.deviation_windows = rank.normal_streak = 0
    rank.deterministic = False


def _window_figures(
    judged: Judgement, rank: RankMemory, step: int, now: float
) -> dict[str, object]:
    return {
        "step": step,
        "updated_at": now,
        "ratio": judged.ratio,
        "windows": rank.deviation_windows,
        "evidence": judged.evidence(rank.deviation_windows),
    }


def with_step_times(judged: Judgement, stats: WindowStats, rank: RankMemory) -> Judgement:
    """A normal window is kept (the job's pace before an onset); a straggler's judgement
    gets the step times now and before: moving its node wins back the difference, also
    what its slowness costs everyone's communication, which no model of compute sees."""
    if judged.verdict is Verdict.NORMAL:
        rank.normal_step_s.append(stats.step_s)
    elif judged.verdict is Verdict.SLOW:
        before = min(rank.normal_step_s, default=None)
        return judged._replace(step_s=stats.step_s, step_s_before=before)
    return judged
