"""The node registry's decisions (pure): whether a node's join or heartbeat is admitted,
the record it leaves, and which registered nodes are free spares for a job."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from antdt.schemas import ErrorCode, NodeRecord, NodeReport, NodeState

#: Seconds a node's record lives after each join or heartbeat (the gate beats every
#: HEARTBEAT_S, so three beats may be lost before another process may take the name).
NODE_TTL_S = 15.0


@dataclass(frozen=True)
class Refusal:
    code: ErrorCode
    reason: str


def admit(
    report: NodeReport,
    current: NodeRecord | None,
    *,
    now: float,
    blocklisted: bool,
    join: bool,
    ttl_s: float = NODE_TTL_S,
) -> NodeRecord | Refusal:
    """The record after `report` (a join when `join`, else a heartbeat), or why not: a
    blocklisted host may not join; a host whose live record another process holds may
    neither join nor beat. A heartbeat of a blocklisted host is kept (it still hosts
    ranks until they exit), so the registry shows it but no spare is counted on it."""
    if join and blocklisted:
        return Refusal(
            ErrorCode.BLOCKLISTED,
            f"host {report.host} is on the blocklist (a rank was moved off it): it may not "
            "join job {job}; `antdt blocklist allow {host}` lets it back".format(
                job=report.job, host=report.host
            ),
        )
    if current is not None and current.process != report.process and current.live(now):
        return Refusal(
            ErrorCode.NODE_TAKEN,
            f"host {report.host} of job {report.job} is held by process {current.process} "
            f"(seen {now - current.seen_at:.1f}s ago, expires in "
            f"{current.expires_at - now:.1f}s): start one torchrun per host, or give each "
            "node its own ANTDT_HOST",
        )
    same = current is not None and current.process == report.process and current.live(now)
    return NodeRecord(
        host=report.host,
        process=report.process,
        address=report.address,
        state=report.state,
        run_id=report.run_id,
        restart_round=report.restart_round,
        registered_at=current.registered_at if same and current else now,
        seen_at=now,
        expires_at=now + ttl_s,
    )


def live_nodes(records: Iterable[NodeRecord], now: float) -> dict[str, NodeRecord]:
    """Every node whose record has not expired at `now`, by host."""
    return {r.host: r for r in records if r.live(now)}


def free_spares(
    nodes: Mapping[str, NodeRecord], hosts_in_use: Collection[str], blocklist: Collection[str]
) -> tuple[str, ...]:
    """Live registered nodes that host no rank now (neither by a rank's hello nor by
    their own report) and are not blocklisted, sorted."""
    return tuple(
        sorted(
            host
            for host, record in nodes.items()
            if record.state != NodeState.PARTICIPANT
            and host not in hosts_in_use
            and host not in blocklist
        )
    )
