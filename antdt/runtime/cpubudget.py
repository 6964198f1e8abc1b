"""CPU budgets and real contention in them, for the test bed's hosts, the demo's and the
bench's ranks: a budget is a cgroup with a CPU quota (cgroup v2 `cpu.max`, or v1
`cpu.cfs_quota_us`), or, where neither can be written, pinning to one core.

A process joins its budget between fork and exec (or through `python -m
antdt.runtime.cpubudget PREFIX COMMAND...`), so its children inherit it: a noisy
neighbour started in a budget competes only for that budget's CPU, never freeing the
others' nor taking theirs (a sleep would free it)."""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("antdt.cpubudget")

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CPU_ROOT = CGROUP_ROOT / "cpu"
#: The quota's period: short, so a throttled host runs in small slices, not 100 ms bursts.
PERIOD_US = 10_000


class CpuLimit(enum.Enum):
    """How a host's CPU budget is enforced on this machine (decided once, by probing)."""

    CGROUP_V2 = "cgroup-v2"
    CGROUP_V1 = "cgroup-v1"
    AFFINITY = "affinity"


def detect(root: Path = CGROUP_ROOT) -> tuple[CpuLimit, Path | None]:
    """The way to limit CPU here and the cgroup directory under which to make budgets."""
    if (root / "cgroup.controllers").exists():
        with contextlib.suppress(OSError):
            if "cpu" not in (root / "cgroup.subtree_control").read_text().split():
                (root / "cgroup.subtree_control").write_text("+cpu")
            if os.access(root, os.W_OK):
                return CpuLimit.CGROUP_V2, root
    v1 = root / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists() and os.access(v1, os.W_OK):
        return CpuLimit.CGROUP_V1, v1
    return CpuLimit.AFFINITY, None


#: The neighbour: pins itself (core -1: not), says so, then spins until its parent is gone
#: or time is up, busy for `duty` of every 10 ms (spinning, never sleeping, when 1).
_BUSY_LOOP = """
import os, sys, time
core, parent, deadline = int(sys.argv[1]), int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
duty = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
if core >= 0:
    os.sched_setaffinity(0, {core})
print("ready", flush=True)
while os.getppid() == parent and time.monotonic() < deadline:
    if duty >= 1.0:
        for _ in range(200_000):
            pass
        continue
    start = time.monotonic()
    while time.monotonic() - start < 0.01 * duty:
        pass
    time.sleep(0.01 * (1.0 - duty))
"""


def busy_argv(core: int | None, *, max_s: float = 600.0, duty: float = 1.0) -> list[str]:
    """The command of one CPU-bound process (pinned to `core` unless None) that prints
    "ready" once running, and stops when this process is gone or after `max_s`."""
    pin_to = -1 if core is None else core
    return [sys.executable, "-c", _BUSY_LOOP, str(pin_to), str(os.getpid()), str(max_s), str(duty)]


@dataclass
class CpuBudget:
    """One budget (a host's, a rank's): `cpus` CPUs' worth of time (None: unlimited)."""

    name: str
    cpus: float | None
    limit: CpuLimit
    parent: Path | None
    #: Under AFFINITY, the index of the core it is pinned to (taken modulo the cores).
    core: int | None = None

    @property
    def path(self) -> Path | None:
        if self.cpus is None or self.parent is None or self.limit is CpuLimit.AFFINITY:
            return None
        return self.parent / self.name

    def create(self) -> CpuBudget:
        if self.cpus is None:
            return self
        if self.path is None:
            cores = sorted(os.sched_getaffinity(0))
            self.core = cores[(self.core or 0) % len(cores)]
            log.warning(
                "no writable cgroup for a CPU quota: pinning to one core instead",
                budget=self.name,
                core=self.core,
            )
            return self
        self.path.mkdir(exist_ok=True)
        quota = max(1000, round(self.cpus * PERIOD_US))
        if self.limit is CpuLimit.CGROUP_V2:
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        return self

    def join_self(self) -> None:
        """Put the calling process in this budget (between fork and exec: async-signal
        tolerant, no logging)."""
        if self.path is not None:
            with open(self.path / "cgroup.procs", "w") as procs:
                procs.write("0")
        elif self.core is not None:
            os.sched_setaffinity(0, {self.core})

    def add(self, pid: int) -> None:
        """Move a running process (all its threads) into this budget."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(pid))
        elif self.core is not None:
            os.sched_setaffinity(pid, {self.core})

    def remove(self, timeout: float = 5.0) -> None:
        if self.path is not None:
            remove_cgroup(self.path, timeout)


def cgroup_pids(path: Path) -> list[int]:
    try:
        return [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def remove_cgroup(path: Path, timeout: float = 5.0) -> None:
    """Kill what is left in the cgroup at `path` and remove it (gone already: fine)."""
    deadline = time.monotonic() + timeout
    while path.exists():
        for pid in cgroup_pids(path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class RankBudgets:
    """One budget of `cpus` per rank (cgroups `<prefix>-r<rank>`), each with `hogs`
    stopped busy loops in it; `slow(ranks)` runs the loops of those ranks only, so a
    slowed rank shares its own budget with them. `close` removes loops and budgets."""

    def __init__(self, tag: str, world: int, cpus: float, hogs: int) -> None:
        limit, parent = detect()
        if limit is CpuLimit.AFFINITY or parent is None:
            raise BudgetsUnavailable("no writable cgroup for a CPU quota")
        self.prefix = str(parent / f"antdt-{tag}")
        self.budgets = [
            CpuBudget(f"antdt-{tag}-r{r}", cpus, limit, parent).create() for r in range(world)
        ]
        self.hogs: list[list[subprocess.Popen[str]]] = []
        self.running: set[int] = set()
        try:
            for budget in self.budgets:
                self.hogs.append([_stopped_hog(budget) for _ in range(hogs)])
        except BaseException:
            self.close()
            raise

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run in its rank's budget (the rank from RANK in its environment)."""
        return [sys.executable, "-m", "antdt.runtime.cpubudget", self.prefix, *argv]

    def slow(self, ranks: set[int]) -> None:
        for rank in ranks ^ self.running:
            sig = signal.SIGCONT if rank in ranks else signal.SIGSTOP
            for proc in self.hogs[rank]:
                proc.send_signal(sig)
        self.running = set(ranks)

    def close(self) -> None:
        for procs in self.hogs:
            for proc in procs:
                proc.kill()
                proc.wait(10)
                if proc.stdout is not None:
                    proc.stdout.close()
        self.hogs = []
        for budget in self.budgets:
            budget.remove()


class BudgetsUnavailable(RuntimeError):
    """No cgroup CPU quota can be written here (not root, or no cgroupfs)."""


def _stopped_hog(budget: CpuBudget) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        busy_argv(None, max_s=1800), stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    budget.add(proc.pid)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError("a busy loop did not start")
    proc.send_signal(signal.SIGSTOP)
    return proc


def main(argv: list[str]) -> None:
    """`python -m antdt.runtime.cpubudget PREFIX COMMAND...`: join `PREFIX-r<RANK>`, then
    become COMMAND."""
    if len(argv) < 2:
        raise SystemExit("usage: python -m antdt.runtime.cpubudget PREFIX COMMAND...")
    prefix, command = argv[0], argv[1:]
    with open(f"{prefix}-r{os.environ['RANK']}/cgroup.procs", "w") as procs:
        procs.write("0")
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
