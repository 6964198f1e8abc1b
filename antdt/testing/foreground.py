"""A scenario in the foreground of a shared machine: this process and every process it
starts run at a higher scheduling priority, so the machine's other work only fills the
gaps, as if the scenario had the node to itself. Where the kernel shares CPU between
sessions (autogroup), that priority is the session's, and each new session starts at 0:
a thread applies it to every process started in the block. Needs CAP_SYS_NICE; without it, nothing
changes (`foreground` yields False). Linux only."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

#: Weight about 28x a default session's: with four busy sessions at 0 beside it, a
#: scenario's process keeps about 0.88 of its core (at -10 it kept 0.70, too little for
#: a 2x straggler to show as one).
NICE = -15


def _parents() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:  # the command may hold spaces and parentheses: the fields follow the last ")"
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(stat[1]), []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`."""
    children, found, todo = _parents(), [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def session_nice(pid: int) -> int | None:
    """The autogroup nice of `pid`'s session (None: no autogroup, or gone)."""
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def prioritise(pid: int, nice: int) -> bool:
    """Give `pid`'s threads, and its session where the kernel has autogroups, the
    priority `nice`; False where that was not permitted (or the process is gone)."""
    done = True
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    threads = _threads(pid)
    for tid in threads:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) != nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:
            done = False
    return bool(threads) and done and session_nice(pid) in (None, nice)


def _threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


@contextlib.contextmanager
def foreground(nice: int = NICE, every_s: float = 0.1) -> Iterator[bool]:
    """Run the block with this process and the processes it starts (and theirs) at
    `nice`, new ones within `every_s`; yields whether permitted. Processes started before
    are left alone; this process's priorities are restored after."""
    me = os.getpid()
    earlier = set(descendants(me))
    before = {tid: os.getpriority(os.PRIO_PROCESS, tid) for tid in _threads(me)}
    session = session_nice(me)
    permitted = prioritise(me, nice)
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(every_s):
            for pid in descendants(me):
                if pid not in earlier:
                    prioritise(pid, nice)

    keeper = threading.Thread(target=keep, name="foreground", daemon=True)
    if permitted:
        keeper.start()
    try:
        yield permitted
    finally:
        stop.set()
        if keeper.is_alive():
            keeper.join()
        for tid in _threads(me):  # threads started in the block took the block's priority
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, before.get(tid, before[me]))
        if session is not None:
            with contextlib.suppress(OSError):
                Path(f"/proc/{me}/autogroup").write_text(str(session))
