"""The node registry's pure parts: admission (admitted, blocklisted, taken, expired), the
free spares of a job, and antdt-nd without a free spare (the restart held, its reason the
executor records, batches still adjusted)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from antdt.schemas import ErrorCode, NodeHeartbeat, NodeJoin, NodeRecord, NodeState
from antdt.services.controller.guardrails import Guardrails
from antdt.services.controller.nodes import Refusal, admit, free_spares, live_nodes
from antdt.services.controller.policies import KillRestartAction
from antdt.services.controller.restarts import no_spare, restart_violation
from antdt.services.controller.view import JobView
from tests.unit.test_policy_nd import HOSTS, decide, kinds, nd_view

NOW = 1000.0


def report(
    host: str = "n1",
    process: str = "p1",
    state: NodeState = NodeState.JOINING,
    *,
    beat: bool = False,
) -> NodeJoin | NodeHeartbeat:
    kind = NodeHeartbeat if beat else NodeJoin
    return kind(
        job="j",
        host="n1",
        process=process,
        address="10.0.0.1",
        state=state,
        run_id="run",
        restart_round=0,
    )


def record(
    host: str, state: NodeState = NodeState.WAITING, *, process: str = "p1", expires: float = 1e9
) -> NodeRecord:
    return NodeRecord(
        host=host,
        process=process,
        address="10.0.0.1",
        state=state,
        run_id="run",
        restart_round=0,
        registered_at=900.0,
        seen_at=990.0,
        expires_at=expires,
    )


# ---------------------------------------------------------------------- admission


def test_a_new_node_is_admitted_with_an_expiry() -> None:
    written = admit(report(), None, now=NOW, blocklisted=False, join=True, ttl_s=15.0)
    assert isinstance(written, NodeRecord)
    assert (written.registered_at, written.seen_at, written.expires_at) == (NOW, NOW, NOW + 15)


def test_a_blocklisted_host_may_not_join_but_its_heartbeat_is_kept() -> None:
    refused = admit(report(), None, now=NOW, blocklisted=True, join=True)
    assert isinstance(refused, Refusal) and refused.code == ErrorCode.BLOCKLISTED
    assert "n1" in refused.reason and "antdt blocklist allow n1" in refused.reason
    beat = report(state=NodeState.PARTICIPANT, beat=True)
    kept = admit(beat, record("n1"), now=NOW, blocklisted=True, join=False)
    assert isinstance(kept, NodeRecord) and kept.state == NodeState.PARTICIPANT


@pytest.mark.parametrize("join", [True, False])
def test_a_second_process_for_a_live_host_is_refused(join: bool) -> None:
    held = record("n1", process="p1", expires=NOW + 5)
    refused = admit(
        report(process="p2", beat=not join), held, now=NOW, blocklisted=False, join=join
    )
    assert isinstance(refused, Refusal) and refused.code == ErrorCode.NODE_TAKEN
    assert "p1" in refused.reason


def test_an_expired_record_frees_the_name_for_another_process() -> None:
    lapsed = record("n1", process="p1", expires=NOW)
    taken = admit(report(process="p2"), lapsed, now=NOW, blocklisted=False, join=True)
    assert isinstance(taken, NodeRecord)
    assert (taken.process, taken.registered_at) == ("p2", NOW)


def test_the_same_process_keeps_its_first_registration() -> None:
    beat = report(state=NodeState.WAITING, beat=True)
    again = admit(beat, record("n1"), now=NOW, blocklisted=False, join=False)
    assert isinstance(again, NodeRecord)
    assert (again.registered_at, again.state, again.seen_at) == (900.0, NodeState.WAITING, NOW)


# ---------------------------------------------------------------------- free spares


def test_free_spares_are_live_waiting_unused_unblocked_nodes() -> None:
    nodes = live_nodes(
        [
            record("h0", NodeState.PARTICIPANT),
            record("h3"),  # hosts a rank by its hello, whatever it reports
            record("spare"),
            record("joining", NodeState.JOINING),
            record("blocked"),
            record("gone", expires=NOW),
        ],
        NOW,
    )
    assert "gone" not in nodes
    spares = free_spares(nodes, {"h0", "h3"}, {"blocked"})
    assert spares == ("joining", "spare")


def spare_view(*spares: str, participants: tuple[str, ...] = ("h0", "h1", "h2", "h3")) -> JobView:
    nodes = {h: record(h, NodeState.PARTICIPANT) for h in participants}
    nodes.update({h: record(h) for h in spares})
    return replace(nd_view(batch=(39, 38, 38, 13), version=1), nodes=nodes)


def test_view_free_spares_leave_out_hosts_of_ranks_and_the_blocklist() -> None:
    v = spare_view("h4", "h5")
    assert v.free_spares == ("h4", "h5")
    assert replace(v, blocklist=frozenset({"h4"})).free_spares == ("h5",)
    assert replace(v, hosts={**HOSTS, 0: "h5"}).free_spares == ("h4",)


# ------------------------------------------------------------------- antdt-nd holds


def test_with_a_free_spare_the_restart_is_decided() -> None:
    [action] = decide(spare_view("h4"))
    assert isinstance(action, KillRestartAction) and action.host == "h3"
    assert restart_violation(spare_view("h4"), action, Guardrails()) == ""


def test_without_a_free_spare_the_restart_is_held_and_its_reason_given() -> None:
    v = spare_view()  # every registered node hosts a rank
    actions = decide(v)
    assert kinds(actions)[0] == "restart"  # for the executor to refuse, and record why
    held = actions[0]
    reason = restart_violation(v, held, Guardrails())
    assert reason.startswith("no free spare node") and "h0, h1, h2, h3" in reason
    assert reason == no_spare(v, "h3")


def test_a_blocklisted_spare_is_no_spare() -> None:
    v = replace(spare_view("h4"), blocklist=frozenset({"h4"}))
    assert kinds(decide(v))[0] == "restart" and no_spare(v, "h3")


def test_without_registered_nodes_the_launcher_is_trusted_as_before() -> None:
    v = nd_view(batch=(39, 38, 38, 13), version=1)
    assert v.nodes == {} and no_spare(v, "h3") == ""
    assert kinds(decide(v)) == ["restart"]


def test_a_short_run_holds_nothing_for_want_of_a_spare() -> None:
    v = replace(spare_view(), remaining_samples=1_000_000)  # a restart would not pay
    assert "restart" not in kinds(decide(v))
