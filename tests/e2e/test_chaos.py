"""The chaos soak, short (issue 40): four faults of four kinds, one every ~8 s, on a real
job against two replicas of each service and 3-node NATS and etcd clusters. `make chaos`
runs the long ones (tests/chaos)."""

from __future__ import annotations

from pathlib import Path

import pytest

from antdt.testing.faults import FaultKind, FaultState, table
from tests.chaos import run_soak
from tests.chaos.timeline import draw

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.integration, pytest.mark.long]


def test_a_short_soak_keeps_every_invariant_through_four_kinds_of_fault(tmp_path: Path) -> None:
    """Seed 0: a core contended, a NATS node, a monitor replica and rank 0 killed -9. The
    job finishes, every sample reaches the model once per epoch, no action is applied
    twice, no incident is open without a fault near it, nothing is left running, and each
    fault was followed by a step of the job."""
    soak = run_soak(0, 4, tmp_path, every_s=8.0)
    draw(soak.steps, soak.records, tmp_path / "timeline.png", "short chaos soak")
    print("\n" + table(soak.records))
    assert soak.problems == []
    assert {r.fault.kind for r in soak.records} == {
        FaultKind.CONTEND_CPU,
        FaultKind.KILL_NATS,
        FaultKind.KILL_REPLICA,
        FaultKind.KILL_RANK,
    }
    assert [r.state for r in soak.records] == [FaultState.RECOVERED] * 4, table(soak.records)
    assert (tmp_path / "timeline.png").stat().st_size > 0
