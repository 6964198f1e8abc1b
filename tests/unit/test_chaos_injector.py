"""The chaos soak's injector and jobs (tests/chaos), without a job running: which faults a
job takes, and the undo bookkeeping (each fault undone once, a refused one holds
nothing). Real processes where a fault starts some (busy loops), nothing faked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from antdt.runtime.config import ServiceSettings
from antdt.runtime.servers import EmbeddedEtcd, EmbeddedNats
from antdt.testing.faults import Fault, FaultKind, schedule
from antdt.testing.foreground import descendants
from tests.chaos.inject import Injector, targets
from tests.chaos.jobs import LocalJob
from tests.chaos.stack import Replicas
from tests.clusters import Clusters


def injector(tmp_path: Path) -> Injector:
    clusters = Clusters(
        [EmbeddedNats(tmp_path / f"n{i}") for i in range(3)],
        [EmbeddedEtcd(tmp_path / f"e{i}") for i in range(3)],
    )
    replicas = Replicas(ServiceSettings(), tmp_path / "logs", "mark")
    return Injector(clusters, replicas, LocalJob(2, [0, 1], tmp_path))


def fault(number: int, kind: FaultKind, target: str) -> Fault:
    return Fault(number, at_s=1.0, kind=kind, target=target, hold_s=2.0)


def test_a_local_job_is_never_scheduled_a_link_cut_and_refuses_one(tmp_path: Path) -> None:
    chaos = injector(tmp_path)
    breakable = targets(chaos.clusters, chaos.replicas, chaos.job)
    assert breakable.hosts == ["core0", "core1"] and breakable.ranks == ["rank0", "rank1"]
    plan = schedule(1, breakable, count=40, leave_out=chaos.job.left_out)
    assert FaultKind.CUT_LINK not in {f.kind for f in plan}
    assert len({f.kind for f in plan}) == len(FaultKind) - 1
    with pytest.raises(ValueError, match="no link"):
        chaos.inject(fault(0, FaultKind.CUT_LINK, "core0"))
    assert chaos.undo(fault(0, FaultKind.CUT_LINK, "core0")) is None


def test_a_fault_on_a_target_not_running_is_refused_and_holds_nothing(tmp_path: Path) -> None:
    chaos = injector(tmp_path)
    for kind, target in [(FaultKind.PAUSE, "monitor-0"), (FaultKind.KILL_REPLICA, "shards-1")]:
        with pytest.raises(ValueError, match="not running"):
            chaos.inject(fault(3, kind, target))
        assert chaos.undo(fault(3, kind, target)) is None


def test_contention_is_undone_once_and_its_busy_loops_end(tmp_path: Path) -> None:
    chaos = injector(tmp_path)
    before = set(descendants(os.getpid()))
    contend = fault(5, FaultKind.CONTEND_CPU, "core1")
    assert "busy loops" in chaos.inject(contend)
    assert len(set(descendants(os.getpid())) - before) == 2
    assert chaos.undo(contend) == "busy loops stopped"
    assert set(descendants(os.getpid())) - before == set()
    assert chaos.undo(contend) is None  # once undone, nothing is held
    chaos.undo_all()
