"""antdt.testing.foreground: a scenario's processes above the rest of a shared machine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from antdt.testing.foreground import NICE, descendants, foreground, session_nice
from tests.helpers import wait_for_sync

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")


def sleeper() -> subprocess.Popen[bytes]:
    """A process in a session of its own, as ranks and neighbours are (a new autogroup)."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
    )


def test_processes_started_in_the_block_take_its_priority_and_the_block_gives_back_its_own() -> (
    None
):
    me, session = os.getpid(), session_nice(os.getpid())
    before = os.getpriority(os.PRIO_PROCESS, 0)
    started = [sleeper()]  # before the block: left alone
    try:
        with foreground() as permitted:
            started.append(child := sleeper())
            assert child.pid in descendants(me)
            if permitted:
                assert os.getpriority(os.PRIO_PROCESS, 0) == NICE
                wait_for_sync(
                    lambda: (
                        os.getpriority(os.PRIO_PROCESS, child.pid) == NICE
                        and session_nice(child.pid) in (None, NICE)
                    ),
                    timeout=5,
                    what="the child in the foreground",
                )
                assert os.getpriority(os.PRIO_PROCESS, started[0].pid) == before
            else:  # no CAP_SYS_NICE: nothing changes
                assert os.getpriority(os.PRIO_PROCESS, 0) == before
                assert os.getpriority(os.PRIO_PROCESS, child.pid) == before
    finally:
        for process in started:
            process.kill()
            process.wait()
    assert os.getpriority(os.PRIO_PROCESS, 0) == before
    assert session_nice(me) == session
