"""The noisy-neighbour helper (tests/contention.py) makes real contention, and cleans up."""

from __future__ import annotations

import os
import time

import pytest

from tests.contention import cores, noisy_neighbour, pinned

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
