"""What a rank's process says about itself, applied to the detector's ranks (pure): it
exited (RankExit), it started again (RankHello), its incidents carried on from a previous
owner (adopt), or the job given up as abandoned. docs/architecture.md has the rules."""

from __future__ import annotations

from antdt.schemas import (
    ExitReason,
    Incident,
    IncidentKind,
    IncidentState,
    RankExit,
    RankHello,
    StragglerClass,
)
from antdt.services.monitor.deviations import forget_deviation
from antdt.services.monitor.openincidents import OpenIncidents
from antdt.services.monitor.ranks import RankMemory
from antdt.services.monitor.reference import Evidence


def all_exited(ranks: list[RankMemory]) -> bool:
    """Every rank exited and none is to be restarted: the job is over."""
    return all(r.exited not in (None, ExitReason.RESTART) for r in ranks)


def exited(
    ranks: list[RankMemory], exit: RankExit, now: float, book: OpenIncidents
) -> list[Incident]:
    """Rank `exit.rank` stopped on purpose: finished, its incidents resolve and it never
    stalls; closed, its deviation resolves but its silence counts; restarting, nothing
    resolves. Once the job has ended every incident still open resolves."""
    rank = ranks[exit.rank]
    rank.exited, rank.exit_step = exit.reason, max(exit.step, rank.last_step)
    ended = all_exited(ranks)
    ending = ranks if ended else [rank] if exit.reason is not ExitReason.RESTART else []
    transitions = []
    for r in ending:
        if r.deviation is not None:
            transitions.append(_close_on_exit(r, r.deviation, now, book))
        if r.stall is not None and (ended or r.exited is ExitReason.FINISHED):
            transitions.append(_close_on_exit(r, r.stall, now, book))
    return transitions


def abandoned(ranks: list[RankMemory], now: float, book: OpenIncidents) -> list[Incident]:
    """Every rank not yet exited counts as closed, and every open incident resolves."""
    for rank in ranks:
        if rank.exited in (None, ExitReason.RESTART):
            rank.exited, rank.exit_step = ExitReason.CLOSED, rank.last_step
    return [
        _close_on_exit(rank, incident, now, book)
        for rank in ranks
        for incident in (rank.deviation, rank.stall)
        if incident is not None
    ]


def hello_refused(ranks: list[RankMemory], job: str, hello: RankHello) -> str | None:
    """Why a hello changes nothing (counted under that reason), or None."""
    if hello.job != job:
        return "wrong_job"
    if not 0 <= hello.rank < len(ranks):
        return "rank_out_of_range"
    if hello.world_size != len(ranks):
        return "world_size_mismatch"
    if hello.started_at < ranks[hello.rank].started_at:
        return "stale_hello"
    return None


def started(rank: RankMemory, hello: RankHello, now: float, warmup_windows: int) -> None:
    """The rank's new process: its steps and speed count afresh, and until its first
    step it is coming back (as after a RankExit for a restart). Its incidents stay."""
    rank.started_at, rank.host = hello.started_at, hello.host
    rank.last_step, rank.last_ended_at, rank.last_seen_at = -1, 0.0, now
    rank.window.clear()
    rank.window.forget_costs()
    rank.settle_left = 0
    rank.evidence = Evidence()
    rank.history.clear()
    rank.link_rtt_s = None  # its process, perhaps on another host: its link afresh
    rank.warmup_left = warmup_windows
    rank.stats = rank.judgement = None  # the Judge keeps its figures until its next window
    rank.streak, rank.streak_kind = 0, None
    rank.exited, rank.exit_step = ExitReason.RESTART, -1  # back at its first step


def adopt(
    ranks: list[RankMemory], incident: Incident, now: float, book: OpenIncidents
) -> Incident | None:
    """Carry on `incident`, left open by a previous owner: None when adopted; resolved
    (evidence `superseded`) when its rank is out of range or has one of its kind open."""
    stall = incident.kind is IncidentKind.STALLED
    rank = ranks[incident.rank] if 0 <= incident.rank < len(ranks) else None
    if rank is None or (rank.stall if stall else rank.deviation) is not None:
        evidence = {**incident.evidence, "superseded": 1.0}
        return incident.model_copy(
            update={"state": IncidentState.RESOLVED, "updated_at": now, "evidence": evidence}
        )
    rank.host = rank.host or incident.host
    book.opened(incident)
    if stall:  # silent since before the incident opened, as its evidence says
        rank.stall = incident
        if rank.last_seen_at is None:
            rank.last_seen_at = incident.opened_at - incident.evidence.get("silent_s", 0.0)
        return None
    rank.deviation, rank.deviation_step = incident, incident.step
    rank.deviation_windows = rank.streak = incident.windows
    rank.streak_kind = incident.kind
    rank.deterministic = incident.straggler_class is StragglerClass.DETERMINISTIC
    rank.had_normal = not rank.deterministic
    return None


def _close_on_exit(
    rank: RankMemory, incident: Incident, now: float, book: OpenIncidents
) -> Incident:
    """The rank's incident resolved by its exit, at the step it exited after (the step
    of a transition is that at which its state was reached)."""
    if incident is rank.stall:
        rank.stall = None
    else:
        forget_deviation(rank)
    step = max(incident.step, rank.exit_step)
    return book.closed(incident, now, step=step, evidence={**incident.evidence, "exited": 1.0})
