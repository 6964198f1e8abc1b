"""Removing what beds made: one namespace's processes, and every leftover of a bed whose
creator process is gone (a run killed before it could clean up)."""

from __future__ import annotations

import contextlib
import os
import signal
import time

from antdt.runtime import cpubudget as _cgroup
from antdt.testing.hostbed import _net
from antdt.testing.hostbed._names import creator_of


def kill_netns(netns: str, timeout: float = 5.0) -> None:
    """SIGKILL every process in `netns` until none is left, then delete the namespace."""
    deadline = time.monotonic() + timeout
    while (pids := _net.netns_pids(netns)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    _net.delete_netns(netns)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(prefix: str = "antdt") -> list[str]:
    """Remove the namespaces and cgroups named by beds with `prefix` whose creator is
    dead; what was removed. Safe to call any time, also while other beds run."""
    removed = []
    for netns in _net.namespaces():
        creator = creator_of(netns, prefix)
        if creator is not None and not alive(creator):
            kill_netns(netns)
            removed.append(netns)
    _, parent = _cgroup.detect()
    if parent is not None:
        for path in parent.iterdir():
            creator = creator_of(path.name, prefix)
            if path.is_dir() and creator is not None and not alive(creator):
                _cgroup.remove_cgroup(path)
                removed.append(str(path))
    return removed
