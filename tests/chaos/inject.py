"""The soak's one executor: does a planned fault to its target and undoes it (restarts
what was killed, SIGCONT, stops the busy loops, brings a cut link up). It decides
nothing: the schedule (antdt.testing.faults) says what and when; this only acts and says
what it did."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from antdt.runtime.servers import EmbeddedEtcd, EmbeddedNats
from antdt.testing.faults import Fault, FaultKind, Targets
from tests.chaos.jobs import Job
from tests.chaos.stack import Replicas
from tests.clusters import Clusters


def targets(clusters: Clusters, replicas: Replicas, job: Job) -> Targets:
    """What the soak may break: the job's ranks and hosts, the replicas, the nodes."""
    return Targets(
        ranks=job.ranks,
        replicas=replicas.names,
        nats=[f"nats{i}" for i in range(len(clusters.nats))],
        etcd=[f"etcd{i}" for i in range(len(clusters.etcd))],
        hosts=job.hosts,
        processes=job.ranks + replicas.names,
    )


@dataclass
class Injector:
    clusters: Clusters
    replicas: Replicas
    job: Job
    _undo: dict[int, Callable[[], str]] = field(default_factory=dict)

    def inject(self, fault: Fault) -> str:
        """Do `fault`; what was done (ValueError when its target is not there now)."""
        kind, target = fault.kind, fault.target
        if kind is FaultKind.KILL_RANK:
            pid = self._pid(target)
            os.kill(pid, signal.SIGKILL)
            return f"rank pid {pid} killed -9; the group is restarted"
        if kind is FaultKind.KILL_REPLICA:
            pid = self._pid(target)
            os.killpg(pid, signal.SIGKILL)
            self._undo[fault.number] = lambda: self._restart_replica(target)
            return f"replica pid {pid} killed -9"
        if kind in (FaultKind.KILL_NATS, FaultKind.KILL_ETCD):
            node = self._node(target)
            node.kill()
            self._undo[fault.number] = lambda: self._restart_node(target)
            return f"{target} killed -9"
        if kind is FaultKind.PAUSE:
            pid = self._pid(target)
            os.kill(pid, signal.SIGSTOP)
            self._undo[fault.number] = lambda: self._resume(pid)
            return f"pid {pid} stopped"
        if kind is FaultKind.CONTEND_CPU:
            self._undo[fault.number] = self.job.contend(target)
            return f"busy loops on {target}"
        if kind is FaultKind.CUT_LINK:
            self._undo[fault.number] = self.job.cut(target)
            return f"{target}'s link down"
        raise ValueError(f"{kind.value}: not injected by this driver")

    def undo(self, fault: Fault) -> str | None:
        """Undo `fault` (None: nothing to undo, the system restarts it by itself)."""
        action = self._undo.pop(fault.number, None)
        return action() if action is not None else None

    def undo_all(self) -> None:
        """Undo whatever is still held (the soak ends early, or fails)."""
        for number in list(self._undo):
            with contextlib.suppress(Exception):
                self._undo.pop(number)()

    def _pid(self, target: str) -> int:
        if target.startswith("rank"):
            pid = self.job.rank_pid(int(target.removeprefix("rank")))
        else:
            pid = self.replicas.pid(target)
        if pid is None:
            raise ValueError(f"{target} is not running now")
        return pid

    def _node(self, target: str) -> EmbeddedNats | EmbeddedEtcd:
        nodes = self.clusters.nats if target.startswith("nats") else self.clusters.etcd
        return nodes[int(target[-1])]

    def _restart_replica(self, name: str) -> str:
        self.replicas.start_serving([name], timeout=60.0)
        return f"restarted, serving as pid {self.replicas.pid(name)}"

    def _restart_node(self, target: str) -> str:
        self._node(target).start()
        return "restarted on its data"

    @staticmethod
    def _resume(pid: int) -> str:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        return "SIGCONT"
