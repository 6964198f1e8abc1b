"""The soak's training job, two ways behind one interface: `LocalJob`, the ranks under
`antdt launch` on this machine's cores (the short soak of `make test`), and `HostJob`,
one torchrun (`--rdzv-backend=antdt`) per network-namespace host, whose links can be
cut (`make chaos`). The injector breaks a job only through this interface."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from antdt.runtime.servers import die_with_parent
from antdt.testing import noisy_neighbour
from antdt.testing.faults import FaultKind
from antdt.testing.hostbed import Host, HostBed
from antdt.testing.torchrun import stop, worker_pids
from tests.chaos.stack import rank_pid

#: Where the first host's torchrun serves the rendezvous store (the c10d backend's).
RDZV_PORT = 29400
ROOT = Path(__file__).resolve().parents[2]


class Job(Protocol):
    """A job: its ranks and hosts by name (known before it starts), what can break
    them, and its end."""

    @property
    def ranks(self) -> list[str]: ...
    @property
    def hosts(self) -> list[str]: ...
    #: Fault kinds this job cannot take (the schedule leaves them out).
    @property
    def left_out(self) -> frozenset[FaultKind]: ...

    def start(self, env: dict[str, str], max_restarts: int) -> None: ...
    def running(self) -> bool: ...
    def exit_code(self) -> int: ...
    def rank_pid(self, rank: int) -> int | None: ...
    def restarts(self) -> int: ...
    def contend(self, host: str) -> Callable[[], str]: ...
    def cut(self, host: str) -> Callable[[], str]: ...
    def stop(self) -> None: ...


@dataclass
class LocalJob:
    """The ranks under `antdt launch --nproc N`, its group restarted on a rank's failure;
    its "hosts" are cores (no link to cut)."""

    world: int
    cores: list[int]
    logs: Path
    left_out: frozenset[FaultKind] = frozenset({FaultKind.CUT_LINK})
    _launcher: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str], max_restarts: int) -> None:
        argv = [sys.executable, "-m", "antdt.cli", "launch", "--nproc", str(self.world)]
        argv += ["--max-restarts", str(max_restarts), "--", sys.executable]
        argv += ["-m", "antdt.demo.train"]
        with open(self.logs / "launcher.log", "ab") as sink:
            self._launcher = subprocess.Popen(
                argv,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,  # the ranks die with it in turn
            )

    @property
    def launcher(self) -> subprocess.Popen[bytes]:
        if self._launcher is None:
            raise ValueError("the job has not started")
        return self._launcher

    @property
    def ranks(self) -> list[str]:
        return [f"rank{r}" for r in range(self.world)]

    @property
    def hosts(self) -> list[str]:
        return [f"core{c}" for c in self.cores]

    def running(self) -> bool:
        return self.launcher.poll() is None

    def exit_code(self) -> int:
        return self.launcher.wait(30)

    def rank_pid(self, rank: int) -> int | None:
        return rank_pid(self.launcher.pid, rank)

    def restarts(self) -> int:
        """Group restarts so far, as the launcher logged them."""
        return _count(self.logs / "launcher.log", "a rank failed")

    def contend(self, host: str) -> Callable[[], str]:
        stack = contextlib.ExitStack()
        stack.enter_context(noisy_neighbour(int(host.removeprefix("core")), processes=2))
        return lambda: _closed(stack, "busy loops stopped")

    def cut(self, host: str) -> Callable[[], str]:
        raise ValueError(f"{host}: a core has no link to cut")

    def stop(self) -> None:
        if self._launcher is not None and self._launcher.poll() is None:
            self._launcher.terminate()
            self._launcher.wait(30)


@dataclass
class HostJob:
    """One torchrun per host, one rank each; the first host's torchrun serves the
    rendezvous store (a rank killed there leaves its torchrun, and the store, running).
    A rank's failure restarts the group: its torchrun re-enters the rendezvous, the
    others see a node waiting and restart theirs."""

    bed: HostBed
    workers: list[Host]
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    left_out: frozenset[FaultKind] = frozenset()

    def start(self, env: dict[str, str], max_restarts: int) -> None:
        for host in self.workers:
            self._torchrun(host, env, max_restarts)

    def _torchrun(self, host: Host, env: dict[str, str], max_restarts: int) -> None:
        first, world = self.workers[0], len(self.workers)
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={world}:{world}"]
        argv += ["--nproc-per-node=1", "--rdzv-backend=antdt", f"--rdzv-id={env['ANTDT_JOB']}"]
        argv += [f"--rdzv-endpoint={first.address}:{RDZV_PORT}"]
        argv += [f"--rdzv-conf=is_host={'1' if host is first else '0'}"]
        argv += [f"--local-addr={host.address}", f"--max-restarts={max_restarts}"]
        argv += ["--monitor-interval=0.5", "-m", "antdt.demo.train"]
        path = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        full = {**env, "ANTDT_HOST": host.name, "GLOO_SOCKET_IFNAME": "eth0", "PYTHONPATH": path}
        full["LOGLEVEL"] = "INFO"  # torchrun's agent logs its group restarts at INFO
        with open(self.logs / f"torchrun-{host.name}.log", "ab") as sink:
            self.procs[host.name] = self.bed.popen(
                host, argv, env=full, stdout=sink, stderr=subprocess.STDOUT
            )

    @property
    def ranks(self) -> list[str]:
        return [f"rank{r}" for r in range(len(self.workers))]

    @property
    def hosts(self) -> list[str]:
        return [host.name for host in self.workers]

    def running(self) -> bool:
        return any(proc.poll() is None for proc in self.procs.values())

    def exit_code(self) -> int:
        codes = [proc.wait(30) for proc in self.procs.values()]
        return next((code for code in codes if code != 0), 0)

    def rank_pid(self, rank: int) -> int | None:
        for proc in self.procs.values():
            pid = worker_pids(proc.pid).get(rank)
            if pid is not None:
                return pid
        return None

    def restarts(self) -> int:
        """Group restarts so far (each torchrun logs its own: a failed rank's, and the
        others' on seeing its node waiting in the rendezvous)."""
        return sum(
            _count(self.logs / f"torchrun-{h}.log", "will restart worker group") for h in self.hosts
        )

    def contend(self, host: str) -> Callable[[], str]:
        loops = self.bed.contend(self._host(host), share=1.0)
        return lambda: _stopped(self.bed, loops)

    def cut(self, host: str) -> Callable[[], str]:
        node = self._host(host)
        self.bed.cut(node)

        def reconnect() -> str:
            self.bed.reconnect(node)
            return "link up"

        return reconnect

    def stop(self) -> None:
        for proc in self.procs.values():
            stop(proc)

    def _host(self, name: str) -> Host:
        return next(h for h in self.workers if h.name == name)


def _count(log: Path, needle: str) -> int:
    return log.read_text(errors="replace").count(needle) if log.exists() else 0


def _closed(stack: contextlib.ExitStack[bool | None], note: str) -> str:
    stack.close()
    return note


def _stopped(bed: HostBed, loops: list[subprocess.Popen[str]]) -> str:
    for loop in loops:
        bed.stop(loop)
    return f"{len(loops)} busy loop(s) stopped"
