"""What the chaos soak runs and breaks: two replicas of each service as processes of
their own (so that one can be killed -9 and started again), the job's launcher as a
process (its ranks are its children), and the lookups by name the injector needs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from antdt.runtime.config import ServiceSettings
from antdt.runtime.servers import die_with_parent
from antdt.testing.torchrun import environ_of

SERVICES = ("monitor", "controller", "shards")
#: What each service logs once it serves.
STARTED = {
    "monitor": "monitor started",
    "controller": "controller started",
    "shards": "shards service started",
}
#: Every process the soak starts carries this variable (its children inherit it): what
#: the leftover check looks for.
MARK = "CHAOS_SOAK_RUN"


def service_env(settings: ServiceSettings, replica: str, mark: str) -> dict[str, str]:
    """A replica's environment: every node of both clusters, streams R3, short leases."""
    return dict(
        os.environ,
        ANTDT_NATS__URL=settings.nats.url,
        ANTDT_NATS__SUBJECT_PREFIX=settings.nats.subject_prefix,
        ANTDT_NATS__STREAM_REPLICAS="3",
        ANTDT_ETCD__ENDPOINT=settings.etcd.endpoint,
        ANTDT_ETCD__KEY_PREFIX=settings.etcd.key_prefix,
        ANTDT_ETCD__LEASE_TTL_S="2",
        ANTDT_REPLICA_ID=replica,
        ANTDT_TELEMETRY__LOG_FORMAT="json",
        **{MARK: mark},
    )


@dataclass
class Replicas:
    """Two replicas of each service, by name ("monitor-0", ...), each restartable."""

    settings: ServiceSettings
    logs: Path
    mark: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _log_from: dict[str, int] = field(default_factory=dict)  # where its last start's log begins

    @property
    def names(self) -> list[str]:
        return [f"{service}-{i}" for service in SERVICES for i in range(2)]

    def start(self, name: str) -> None:
        service = name.rsplit("-", 1)[0]
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as log:
            self._log_from[name] = log.tell()
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "antdt.cli", service],
                env=service_env(self.settings, name, self.mark),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def start_serving(self, names: list[str], timeout: float = 120.0, tries: int = 5) -> None:
        """Start `names` and wait until each serves: one that exits before it serves (its
        JetStream streams not made in time on a busy machine, a NATS node down) is
        started again, as a supervisor would, up to `tries` times."""
        for name in names:
            self.start(name)
        deadline, left, waiting = (
            time.monotonic() + timeout,
            dict.fromkeys(names, tries),
            set(names),
        )
        while waiting:
            for name in sorted(waiting):
                if self.serving(name):
                    waiting.discard(name)
                elif self.procs[name].poll() is not None:
                    if left[name] == 0:
                        raise RuntimeError(f"{name} never served: {self.procs[name].returncode}")
                    left[name] -= 1
                    self.start(name)
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"replicas not serving after {timeout} s: {sorted(waiting)}")
            time.sleep(0.2)

    def serving(self, name: str) -> bool:
        """The replica's log says it serves (since its last start)."""
        try:
            with open(self.logs / f"{name}.log", "rb") as log:
                log.seek(self._log_from[name])
                text = log.read().decode(errors="replace")
        except OSError:
            return False
        return self.procs[name].poll() is None and STARTED[name.rsplit("-", 1)[0]] in text

    def exited(self) -> list[str]:
        """Replicas not running now, with their exit codes."""
        return [f"{n} (exit {p.returncode})" for n, p in self.procs.items() if p.poll() is not None]

    def pid(self, name: str) -> int | None:
        proc = self.procs.get(name)
        return proc.pid if proc is not None and proc.poll() is None else None

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a paused one must see the SIGTERM
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def children(pid: int) -> list[int]:
    """The child processes of `pid` (every thread's)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            continue
    return found


def rank_pid(launcher: int, rank: int) -> int | None:
    """The live process of `rank` among the launcher's children, if any."""
    for child in children(launcher):
        if environ_of(child).get("RANK") == str(rank):
            return child
    return None


def leftovers(mark: str, root: Path) -> list[str]:
    """Processes, other than this one, carrying `mark` in their environment or `root` in
    their command line: what a run left behind."""
    left = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(root) in cmdline or environ_of(int(entry)).get(MARK) == mark:
            left.append(f"{entry}: {cmdline[:120]}")
    return left
