"""Hosts whose ranks slowed together (antdt.services.monitor.hosts)."""

from __future__ import annotations

import pytest

from antdt.schemas import Incident, IncidentKind, IncidentState
from antdt.services.monitor.hosts import HostRule, HostSlowdown, slow_hosts
from antdt.services.monitor.incidents import transition_id

TWO_HOSTS_OF_FOUR = ("a",) * 4 + ("b",) * 4


@pytest.mark.parametrize(
    ("flagged", "hosts", "named"),
    [
        ({}, TWO_HOSTS_OF_FOUR, []),
        # all four ranks of host b, within a few steps: b, since the first of them
        (
            {4: 120, 5: 118, 6: 125, 7: 121},
            TWO_HOSTS_OF_FOUR,
            [HostSlowdown("b", (4, 5, 6, 7), 118)],
        ),
        # three of four: more than half
        ({0: 40, 1: 41, 3: 44}, TWO_HOSTS_OF_FOUR, [HostSlowdown("a", (0, 1, 3), 40)]),
        # two of four is not more than half: those ranks' own incidents say enough
        ({0: 40, 1: 41}, TWO_HOSTS_OF_FOUR, []),
        # ranks of different hosts are not a host
        ({3: 40, 4: 40}, TWO_HOSTS_OF_FOUR, []),
        # both hosts
        (
            {0: 50, 1: 50, 2: 51, 5: 300, 6: 301, 7: 302},
            TWO_HOSTS_OF_FOUR,
            [HostSlowdown("a", (0, 1, 2), 50), HostSlowdown("b", (5, 6, 7), 300)],
        ),
        # flagged far apart: not slowed together (two causes, or one rank long before)
        ({0: 10, 1: 500, 2: 1000}, TWO_HOSTS_OF_FOUR, []),
        # the largest group within together_steps counts, the straggler long before not
        ({0: 10, 1: 500, 2: 510, 3: 520}, TWO_HOSTS_OF_FOUR, [HostSlowdown("a", (1, 2, 3), 500)]),
        # a host of two ranks, both slow
        ({0: 7, 1: 9}, ("x", "x", "y", "y"), [HostSlowdown("x", (0, 1), 7)]),
        # one rank per host: the host is the rank, nothing to name
        ({0: 7, 1: 9}, ("x", "y"), []),
        # ranks of unknown host are never grouped
        ({0: 7, 1: 9}, ("", ""), []),
    ],
)
def test_slow_hosts(
    flagged: dict[int, int], hosts: tuple[str, ...], named: list[HostSlowdown]
) -> None:
    assert slow_hosts(flagged, hosts) == named


@pytest.mark.parametrize(
    ("rule", "named"),
    [
        (HostRule(), [HostSlowdown("a", (0, 1, 2), 0)]),
        (HostRule(min_share=0.75), []),  # three of four is not more than three quarters
        (HostRule(together_steps=4, min_share=0.4), [HostSlowdown("a", (1, 2), 5)]),
        (HostRule(min_ranks=4), []),
    ],
)
def test_rule(rule: HostRule, named: list[HostSlowdown]) -> None:
    assert slow_hosts({0: 0, 1: 5, 2: 9}, TWO_HOSTS_OF_FOUR, rule) == named


@pytest.mark.parametrize(
    "kwargs",
    [{"min_ranks": 1}, {"min_share": 1.0}, {"min_share": -0.1}, {"together_steps": -1}],
)
def test_rule_refuses_nonsense(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        HostRule(**kwargs)


def test_a_host_named_in_an_incident_is_a_transition_of_its_own() -> None:
    """JetStream drops a message whose id it saw lately: naming the host (or one more
    rank of it) in an incident whose state and windows stayed must not be dropped."""
    opened = Incident(
        id="j-r4-slow-e1-1",
        job="j",
        rank=4,
        host="b",
        kind=IncidentKind.SLOW,
        state=IncidentState.OPENED,
        step=120,
        opened_at=1.0,
        updated_at=1.0,
        ratio=1.3,
        windows=1,
    )
    named = opened.model_copy(update={"host_ranks": (4, 5, 6)})
    grown = opened.model_copy(update={"host_ranks": (4, 5, 6, 7)})
    ids = [transition_id(i) for i in (opened, named, grown, grown)]
    assert ids[0] == "j-r4-slow-e1-1-opened-1"  # as before hosts were named
    assert len(set(ids)) == 3  # a retry of the same transition has the same id
