"""The agent's choice of subject for its next fetch (agent/route.py), driven by time."""

from __future__ import annotations

from antdt.agent.route import ShardRoute
from antdt.schemas import ShardReply, Subjects, route_token

SUBJECTS = Subjects("antdt.t")


def test_starts_on_the_queue_group_and_follows_the_named_owner() -> None:
    route = ShardRoute(SUBJECTS, "j")
    assert route.subject == "antdt.t.j.shards.fetch"
    route.on_reply("r-1", now=0.0)
    assert route.subject == "antdt.t.j.shards.fetch.r-1"
    route.on_reply("", now=1.0)  # the replica knows no owner: back to the group
    assert route.subject == route.shared


def test_a_failed_owner_is_avoided_for_the_cooldown_even_if_replies_name_it() -> None:
    route = ShardRoute(SUBJECTS, "j", cooldown_s=10)
    route.on_reply("r-1", now=0.0)
    route.on_failure(now=1.0)
    assert route.subject == route.shared and route.fallbacks == 1
    route.on_reply("r-1", now=5.0)  # its lease has not lapsed yet: still named
    assert route.subject == route.shared
    route.on_reply("r-2", now=6.0)  # the survivor took over
    assert route.route == "r-2"
    route.on_reply("r-1", now=11.5)  # back after the cooldown
    assert route.route == "r-1"


def test_a_failure_on_the_queue_group_changes_nothing() -> None:
    route = ShardRoute(SUBJECTS, "j")
    route.on_failure(now=0.0)
    assert route.subject == route.shared and route.fallbacks == 0


def test_route_tokens_are_single_subject_tokens_the_reply_accepts() -> None:
    for replica in ("host.example.com-123", "a b*c>d", "", "x" * 300):
        token = route_token(replica)
        assert token and "." not in token and len(token) <= 128
        ShardReply(job="j", epoch=0, status="ok", route=token)
    assert route_token("node-7_a") == "node-7_a"
