"""Silent ranks: who is stalled, and their STALLED incidents opened and resolved (pure)."""

from __future__ import annotations

from antdt.schemas import ExitReason, Incident, IncidentKind, IncidentState
from antdt.services.monitor.openincidents import OpenIncidents
from antdt.services.monitor.ranks import RankMemory


def silent_since(rank: RankMemory, first_seen: float) -> float:
    """When the rank was last heard from; one never heard from, since the job's first
    event anywhere (`first_seen`)."""
    return rank.last_seen_at if rank.last_seen_at is not None else first_seen


def newly_stalled(
    ranks: list[RankMemory], now: float, limit: float, restarting: float, first_seen: float
) -> list[RankMemory]:
    """The ranks to open a STALLED incident for: silent past `limit` (`restarting` for
    a rank coming back from a restart), a finished rank never."""
    watched = [r for r in ranks if r.exited is not ExitReason.FINISHED]
    silent = [
        r
        for r in watched
        if now - silent_since(r, first_seen)
        > (restarting if r.exited is ExitReason.RESTART else limit)
    ]
    if len(silent) < len(watched):
        # The job moves on without them: each silent rank is stalled on its own.
        return [r for r in silent if r.stall is None]
    # Under BSP everyone blocks behind a hung rank: blame those furthest behind.
    behind = min((r.last_step for r in silent), default=0)
    return [r for r in silent if r.last_step == behind and r.stall is None]


def open_stall(
    rank: RankMemory, now: float, limit: float, first_seen: float, book: OpenIncidents
) -> Incident:
    rank.stall = Incident(
        id=book.new_id(rank.rank, IncidentKind.STALLED),
        job=book.job,
        rank=rank.rank,
        host=rank.host,
        kind=IncidentKind.STALLED,
        state=IncidentState.OPENED,
        step=max(rank.last_step, 0),
        opened_at=now,
        updated_at=now,
        ratio=rank.judgement.ratio if rank.judgement else 1.0,
        windows=0,
        evidence={
            "silent_s": now - silent_since(rank, first_seen),
            "limit_s": limit,
            "last_step": rank.last_step,
        },
    )
    return book.opened(rank.stall)


def resolve_stall(
    rank: RankMemory, step: int, now: float, first_seen: float, book: OpenIncidents
) -> Incident:
    """The silent rank stepped again: its stall resolves, with how long it was silent."""
    incident = rank.stall
    assert incident is not None
    evidence = {**incident.evidence, "silent_s": now - silent_since(rank, first_seen)}
    rank.stall = None
    return book.closed(incident, now, step=step, evidence=evidence)
