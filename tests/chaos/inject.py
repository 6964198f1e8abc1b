"""The soak's one executor: does a planned fault to its target and undoes it (restarts
what was killed, SIGCONT, stops the busy loops). It decides nothing: the schedule
(antdt.testing.faults) says what and when; this only acts and says what it did."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from antdt.runtime.servers import EmbeddedEtcd, EmbeddedNats
from antdt.testing import noisy_neighbour
from antdt.testing.faults import Fault, FaultKind, Targets
from tests.chaos.stack import Replicas, rank_pid
from tests.clusters import Clusters


def targets(clusters: Clusters, replicas: Replicas, world: int, cores: list[int]) -> Targets:
    """What the soak may break; no link cut (no namespace hosts here)."""
    ranks = [f"rank{r}" for r in range(world)]
    return Targets(
        ranks=ranks,
        replicas=replicas.names,
        nats=[f"nats{i}" for i in range(len(clusters.nats))],
        etcd=[f"etcd{i}" for i in range(len(clusters.etcd))],
        hosts=[f"core{c}" for c in cores],
        processes=ranks + replicas.names,
    )


@dataclass
class Injector:
    clusters: Clusters
    replicas: Replicas
    launcher: int  # the pid of the job's launcher: its children are the ranks
    world: int
    cores: list[int]
    _undo: dict[int, Callable[[], str]] = field(default_factory=dict)

    def inject(self, fault: Fault) -> str:
        """Do `fault`; what was done (ValueError when its target is not there now)."""
        kind, target = fault.kind, fault.target
        if kind is FaultKind.KILL_RANK:
            pid = self._pid(target)
            os.kill(pid, signal.SIGKILL)
            return f"rank pid {pid} killed -9; the launcher restarts the group"
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
            stack = contextlib.ExitStack()
            stack.enter_context(noisy_neighbour(int(target.removeprefix("core")), processes=2))
            self._undo[fault.number] = lambda: _stop_neighbours(stack)
            return "2 busy loops pinned"
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
            pid = rank_pid(self.launcher, int(target.removeprefix("rank")))
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


def _stop_neighbours(stack: contextlib.ExitStack[bool | None]) -> str:
    stack.close()
    return "busy loops stopped"
