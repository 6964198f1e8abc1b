"""The route of the gradient exchange around a step's offering ranks (pure part)."""

from __future__ import annotations

from antdt.agent.routing import Route, route_around


def test_no_route_without_offers_or_when_every_rank_offered() -> None:
    assert route_around(4, frozenset()) is None
    assert route_around(3, frozenset({0, 1, 2})) is None


def test_each_offering_rank_gets_a_partner_round_robin_over_the_others() -> None:
    # golden: every rank computes the same route from the same offers
    assert route_around(4, frozenset({3})) == Route((0, 1, 2), {3: 0})
    assert route_around(6, frozenset({1, 4, 5})) == Route((0, 2, 3), {1: 0, 4: 2, 5: 3})
    assert route_around(5, frozenset({0, 1, 2, 3})) == Route((4,), {0: 4, 1: 4, 2: 4, 3: 4})


def test_a_partner_serves_its_offering_ranks_in_rank_order() -> None:
    route = route_around(5, frozenset({4, 1, 2}))
    assert route is not None
    assert route.served_by(0) == [1, 4]
    assert route.served_by(3) == [2]
    assert route.served_by(1) == []


def test_ranks_outside_the_job_are_ignored() -> None:
    assert route_around(3, frozenset({7})) is None
    assert route_around(3, frozenset({2, -1})) == Route((0, 1), {2: 0})


def test_only_gloo_jobs_on_the_default_group_up_to_the_size_limit_are_routed() -> None:
    from antdt.agent.routing import MAX_ROUTED_WORLD, RoutedExchange

    assert RoutedExchange(0, 4, "gloo").enabled
    assert not RoutedExchange(0, 4, "nccl").enabled
    assert not RoutedExchange(0, 4, "gloo", group=object()).enabled
    assert not RoutedExchange(0, MAX_ROUTED_WORLD + 1, "gloo").enabled


def test_share_route_is_on_by_default_and_refuses_what_is_not_on_or_off() -> None:
    import pytest

    from antdt.sharing import ShareParams

    assert ShareParams.from_params({"work_sharing": "on"}).route
    assert not ShareParams.from_params({"work_sharing": "on", "share_route": "off"}).route
    with pytest.raises(ValueError, match="share_route"):
        ShareParams.from_params({"work_sharing": "on", "share_route": "sometimes"})
