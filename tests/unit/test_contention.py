"""The noisy-neighbour helper (antdt.testing.contention): real contention, cleaned up."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from antdt.testing import cores, neighbour_from_step, noisy_neighbour, pinned
from antdt.testing.contention import last_step

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity"
)


def fastest_run_s(runs: int = 6) -> float:
    """The fastest of `runs` timings of a fixed ~40 ms of pure-Python work: the minimum
    sheds what other processes on this machine add now and then, and 40 ms spans many
    scheduler slices, so a run cannot fit in one slice the neighbour left free."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        total = 0
        for i in range(1_500_000):
            total += i
        best = min(best, time.perf_counter() - start)
    return best


def test_a_pinned_busy_loop_slows_a_worker_pinned_to_its_core() -> None:
    """The kernel shares one core between the two: about half of it each, so even the
    fastest run of the worker takes about twice as long as alone (at least 1.3x here:
    other processes share this machine)."""
    core = cores()[-1]
    with pinned(core):
        alone = fastest_run_s()
        with noisy_neighbour(core) as (neighbour,):
            assert os.sched_getaffinity(neighbour.pid) == {core}
            shared = fastest_run_s()
        alone_again = fastest_run_s()
    print(f"\nalone {alone * 1e3:.1f} ms, with a neighbour {shared * 1e3:.1f} ms")
    assert shared >= 1.3 * min(alone, alone_again)


def test_the_neighbour_on_another_core_slows_the_worker_less() -> None:
    if len(cores()) < 2:
        pytest.skip("needs two cores")
    mine, other = cores()[-1], cores()[0]
    with pinned(mine):
        with noisy_neighbour(mine):
            same_core = fastest_run_s()
        with noisy_neighbour(other):
            other_core = fastest_run_s()
    assert other_core < same_core


def test_the_neighbour_stops_when_the_block_fails() -> None:
    with (
        pytest.raises(RuntimeError, match="the test failed"),
        noisy_neighbour(cores()[0], processes=2) as neighbours,
    ):
        assert all(n.poll() is None for n in neighbours)  # running
        raise RuntimeError("the test failed")
    assert all(n.poll() is not None for n in neighbours)  # killed and reaped


def test_the_neighbour_stops_on_its_own_after_max_s() -> None:
    with noisy_neighbour(cores()[0], max_s=0.2) as (neighbour,):
        assert neighbour.wait(timeout=10) == 0


def test_pinned_gives_the_cores_back() -> None:
    before = os.sched_getaffinity(0)
    with pinned(cores()[0]):
        assert os.sched_getaffinity(0) == {cores()[0]}
    assert os.sched_getaffinity(0) == before


async def test_the_neighbour_starts_once_the_progress_file_reaches_the_step(tmp_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    job: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def train() -> None:
        for step in range(8):
            with progress.open("a") as f:
                f.write(json.dumps({"step": step}) + "\n")
            await asyncio.sleep(0.1)

    trainer = asyncio.create_task(train())
    async with neighbour_from_step(cores()[0], progress, 5, job) as first:
        done = last_step(progress)
        assert done is not None and done >= 4 and first == done + 1  # from step 5 on
        assert first <= 7  # not long after it
        assert _neighbours(), "no neighbour running"
    await trainer
    assert not _neighbours()  # gone with the block


async def test_a_job_that_ends_before_the_step_gets_no_neighbour(tmp_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    progress.write_text(json.dumps({"step": 0}) + "\n")
    job: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    job.set_result(0)
    with pytest.raises(RuntimeError, match="ended before step 5"):
        async with neighbour_from_step(cores()[0], progress, 5, job):
            pytest.fail("the neighbour started")
    assert not _neighbours()


def _neighbours() -> list[int]:
    """This process's running busy-loop children (Linux /proc)."""
    me, found = str(os.getpid()), []
    for entry in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z" and b"sched_setaffinity" in command:
            found.append(int(entry))
    return found
