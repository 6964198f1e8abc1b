"""The incident-to-plan bench against the session's real nats-server and etcd, with the
real controller and stand-in ranks in their own process: its rounds measure plans that
really reached every rank, and a round whose events the controller let pass is decided
on the monitor's next health instead of failing the whole `make bench`."""

from __future__ import annotations

from typing import Any

import pytest

from antdt.runtime.servers import EmbeddedCluster
from antdt.services.controller.service import ControllerService
from bench.latency import bench_incident_to_plan

pytestmark = pytest.mark.integration


async def test_a_round_the_controller_let_pass_is_decided_on_the_next_health(
    cluster: EmbeddedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    decide = ControllerService._decide
    seen: list[Any] = []

    async def letting_the_first_round_pass(self: ControllerService, state: Any, event: Any) -> None:
        seen.append(event)
        if len(seen) <= 2:  # round 0's health and incident (a lapsed lease, say)
            return
        await decide(self, state, event)

    monkeypatch.setattr(ControllerService, "_decide", letting_the_first_round_pass)
    figures = await bench_incident_to_plan(cluster, ranks=4, rounds=2)
    assert figures["samples"] == 2
    # Round 0 waited for the re-sent health; the measured rounds did not.
    assert len(seen) >= 2 * 12 + 1  # twelve rounds (ten of warm-up), one health again
    assert 0 < figures["p50_ms"] < 1000
