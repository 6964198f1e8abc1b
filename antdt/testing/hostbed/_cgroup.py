"""A host's CPU budget: a cgroup with a CPU quota (cgroup v2 `cpu.max`, or v1
`cpu.cfs_quota_us`), or, where neither can be written, the host pinned to one core.

Every process the bed starts in a host joins its budget between fork and exec, so its
children inherit it: a noisy neighbour on one host competes only for that host's CPU."""

from __future__ import annotations

import contextlib
import enum
import os
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("antdt.hostbed")

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


@dataclass
class CpuBudget:
    """One host's budget: `cpus` CPUs' worth of time (None: unlimited)."""

    name: str
    cpus: float | None
    limit: CpuLimit
    parent: Path | None
    #: Under AFFINITY, the index of the core the host is pinned to (taken modulo the cores).
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
                "no writable cgroup for a CPU quota: pinning the host to one core instead",
                host=self.name,
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
