"""Real CPU contention for tests: pin processes to cores, run a noisy neighbour on one.

A noisy neighbour is a CPU-bound process pinned to the same core as a rank: the kernel
shares that core between them, so the rank really runs slower (not a sleep). It stops
when its `with` block ends, also when the test fails, and on its own if the test process
dies (it watches its parent) or after `max_s`. Linux only (os.sched_setaffinity).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from antdt.runtime.cpubudget import busy_argv


def cores() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0))


def pin(pid: int, core: int) -> None:
    """Pin process `pid` (0: this one) to `core`."""
    os.sched_setaffinity(pid, {core})


@contextlib.contextmanager
def pinned(core: int) -> Iterator[None]:
    """Run this process on `core` only, and give its cores back afterwards."""
    before = os.sched_getaffinity(0)
    pin(0, core)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def noisy_neighbour(
    core: int, *, processes: int = 1, max_s: float = 600.0
) -> Iterator[list[subprocess.Popen[str]]]:
    """CPU-bound processes pinned to `core` for the `with` block; each is running, pinned,
    when the block starts, and killed and reaped when it ends, however it ends."""
    started: list[subprocess.Popen[str]] = []
    try:
        for _ in range(processes):
            neighbour = subprocess.Popen(
                busy_argv(core, max_s=max_s),
                stdout=subprocess.PIPE,
                text=True,
                # A session of its own: where the kernel shares CPU between sessions
                # (autogroup), a neighbour in the caller's session would only split the
                # caller's share, however many busy loops it ran, and slow its other work.
                start_new_session=True,
            )
            started.append(neighbour)
            assert neighbour.stdout is not None
            if neighbour.stdout.readline().strip() != "ready":
                raise RuntimeError(f"noisy neighbour on core {core} did not start")
        yield started
    finally:
        for neighbour in started:
            neighbour.kill()
        for neighbour in started:
            neighbour.wait(timeout=10)
            if neighbour.stdout is not None:
                neighbour.stdout.close()


def last_step(progress: Path) -> int | None:
    """The last step in a progress file (one JSON object a line, with "step"), if any."""
    try:
        lines = [line for line in progress.read_text().splitlines() if line.endswith("}")]
    except OSError:
        return None
    return int(json.loads(lines[-1])["step"]) if lines else None


@contextlib.asynccontextmanager
async def neighbour_from_step(
    core: int, progress: Path, step: int, job: asyncio.Future[Any], *, processes: int = 1
) -> AsyncIterator[int]:
    """A noisy neighbour on `core` from the moment `progress` shows step `step` - 1 done
    until the block ends; yields the first step it slowed. Raises if `job` ends first."""
    while (done := last_step(progress)) is None or done < step - 1:
        if job.done():
            raise RuntimeError(f"the job ended before step {step} ({progress})")
        await asyncio.sleep(0.02)
    with noisy_neighbour(core, processes=processes):
        yield (last_step(progress) or done) + 1
