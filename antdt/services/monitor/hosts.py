"""Hosts whose ranks slowed together, so an incident can name the node. Pure, no clock.

A host is named when more than `min_share` of its ranks (at least `min_ranks`) were
flagged within `together_steps` of each other: one cause (a noisy neighbour, thermal
throttling, a slow disk) for all of them, which a policy can treat as one straggler.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from antdt.schemas import Incident, IncidentKind
from antdt.services.monitor.ranks import RankMemory


class HostSlowdown(NamedTuple):
    """Ranks of one host flagged together, from `since_step` (the first one's flag)."""

    host: str
    ranks: tuple[int, ...]
    since_step: int


@dataclass(frozen=True)
class HostRule:
    min_ranks: int = 2  # a host of one rank is that rank: nothing to name
    min_share: float = 0.5  # more than this share of the host's ranks
    together_steps: int = 64  # flagged within this many steps of each other

    def __post_init__(self) -> None:
        if self.min_ranks < 2 or not 0.0 <= self.min_share < 1.0 or self.together_steps < 0:
            raise ValueError("min_ranks >= 2, min_share in [0, 1), together_steps >= 0")


def slow_hosts(
    flagged: Mapping[int, int], hosts: Sequence[str], rule: HostRule | None = None
) -> list[HostSlowdown]:
    """The hosts whose ranks slowed together, by host name.

    `flagged`: rank -> the step its slow incident opened at; `hosts[rank]`: its host (""
    when unknown: such ranks are never grouped)."""
    return _slow_hosts_of(flagged, dict(enumerate(hosts)), rule or HostRule())


def _slow_hosts_of(
    flagged: Mapping[int, int], hosts: Mapping[int, str], rule: HostRule
) -> list[HostSlowdown]:
    """`slow_hosts` of the ranks in `hosts` (rank -> host), in rank order."""
    members: defaultdict[str, list[int]] = defaultdict(list)
    for rank, host in sorted(hosts.items()):
        if host:
            members[host].append(rank)
    named = []
    for host in sorted(members):
        ranks = members[host]
        group = _largest_cluster([(flagged[r], r) for r in ranks if r in flagged], rule)
        if len(group) >= rule.min_ranks and len(group) > rule.min_share * len(ranks):
            named.append(HostSlowdown(host, tuple(sorted(r for _, r in group)), group[0][0]))
    return named


def _largest_cluster(steps: list[tuple[int, int]], rule: HostRule) -> list[tuple[int, int]]:
    """The most (step, rank) pairs whose steps lie within `together_steps`; earliest
    first on ties."""
    steps.sort()
    best: list[tuple[int, int]] = []
    start = 0
    for end in range(len(steps)):
        while steps[end][0] - steps[start][0] > rule.together_steps:
            start += 1
        if end + 1 - start > len(best):
            best = steps[start : end + 1]
    return best


def name_hosts(
    ranks: Sequence[RankMemory], now: float, scope: Sequence[RankMemory] | None = None
) -> list[Incident]:
    """Name the hosts whose ranks slowed together in their open SLOW incidents
    (`host_ranks`): the incidents updated, to be published again. A named group only
    grows while its incidents are open (each update is a new transition). `scope`: the
    ranks to group (the host of a rank whose incident just opened: only its naming can
    change; None: every rank)."""
    scope = ranks if scope is None else scope
    flagged = {
        r.rank: r.deviation_step
        for r in scope
        if r.deviation is not None and r.deviation.kind is IncidentKind.SLOW
    }
    if len(flagged) < 2:
        return []
    hosts = {r.rank: r.host for r in scope}
    updated = []
    for named in _slow_hosts_of(flagged, hosts, HostRule()):
        # Those named before stay named (and a rank of theirs slow again joins them).
        together = set(named.ranks)
        for member in named.ranks:
            together.update(_host_ranks(ranks[member]))
        value = tuple(sorted(together))
        for member in value:
            incident = ranks[member].deviation
            if member in flagged and incident is not None and incident.host_ranks != value:
                named_now = incident.model_copy(update={"host_ranks": value, "updated_at": now})
                ranks[member].deviation = named_now
                updated.append(named_now)
    return updated


class HostIndex:
    """The ranks of each host, regrouped only after a rank's host changed (`moved`):
    finding a rank's neighbours costs the host's size, not the job's (every rank was
    compared at each opening, 2 s for 500 openings at 10,000 ranks)."""

    __slots__ = ("_by_host", "_stale")

    def __init__(self) -> None:
        self._by_host: dict[str, list[RankMemory]] = {}
        self._stale = True

    def moved(self) -> None:
        """Some rank's host changed: regroup at the next `same_host`."""
        self._stale = True

    def same_host(self, ranks: Sequence[RankMemory], rank: RankMemory) -> list[RankMemory]:
        """The ranks on `rank`'s host (its host known), in rank order."""
        if self._stale:
            by_host: defaultdict[str, list[RankMemory]] = defaultdict(list)
            for r in ranks:
                by_host[r.host].append(r)
            self._by_host, self._stale = dict(by_host), False
        return self._by_host[rank.host]


def _host_ranks(rank: RankMemory) -> tuple[int, ...]:
    incident = rank.deviation
    return incident.host_ranks or () if incident is not None else ()


__all__ = ["HostIndex", "HostRule", "HostSlowdown", "name_hosts", "slow_hosts"]
