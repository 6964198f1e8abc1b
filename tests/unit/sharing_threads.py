"""Ranks as threads on a real TCPStore, each with its own WorkSharing and claim store
client, for the work-sharing tests: their count and gradient all-reduces are barriers,
their compute is a sleep per sample (a sleeping thread frees the GIL, so the ranks run
side by side)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, NamedTuple

import pytest

from antdt.sharing import ShareParams

#: Sleep per sample of a rank at its normal speed.
PER_SAMPLE_S = 0.002


class Computed(NamedTuple):
    """One micro-batch a rank computed: whose share, its ids and loss weight, and when
    (perf_counter seconds) its compute began and ended."""

    step: int
    rank: int
    owner: int
    ids: tuple[int, ...]
    weight: float
    start: float
    end: float
    one_piece_s: float | None  # the rank's `one_piece` after the step's claims


class Barrier:
    """The all-reduce of `world` threads: every vector summed, handed to each."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world)
        self._vectors: dict[int, list[int]] = {}
        self._sum: list[int] = []

    def all_sum(self, rank: int, vector: list[int]) -> list[int]:
        self._vectors[rank] = vector
        if self.barrier.wait() == 0:
            self._sum = [sum(v) for v in zip(*self._vectors.values(), strict=True)]
        self.barrier.wait()
        summed = list(self._sum)
        self.barrier.wait()  # nobody overwrites the sum before everyone read it
        return summed


def plan(world: int, share: int) -> Any:
    from antdt.schemas import Plan

    return Plan(job="j", version=1, local_batch=(share,) * world, effective_step=0, created_at=0.0)


def own_ids(step: int, rank: int, share: int) -> list[int]:
    return [step * 1000 + rank * 100 + i for i in range(share)]


def run_steps(
    params: ShareParams,
    slow: dict[int, dict[int, float]],
    steps: int,
    world: int = 3,
    share: int = 16,
) -> tuple[list[Computed], Any]:
    """Every rank's micro-batches computed over `steps` steps; `slow`: step -> rank ->
    the factor its own samples take longer by in that step (others' it computes at its
    normal speed). Returns them and the store server."""
    dist = pytest.importorskip("torch.distributed")
    from antdt.agent.claimstore import StoreClaims
    from antdt.agent.shared_work import WorkSharing

    server = dist.TCPStore("127.0.0.1", 0, world + 1, True, wait_for_workers=False)
    stores = [dist.TCPStore("127.0.0.1", server.port, world + 1, False) for _ in range(world)]
    barrier, the_plan = Barrier(world), plan(world, share)
    out: list[Computed] = []
    errors: list[BaseException] = []

    def rank_loop(rank: int) -> None:
        sharing = WorkSharing(params, lambda: StoreClaims(stores[rank], rank, world))
        try:
            for step in range(steps):
                own = own_ids(step, rank, share)
                total = sharing.open(step, the_plan, rank, own, lambda v: barrier.all_sum(rank, v))
                factor = slow.get(step, {}).get(rank, 1.0)
                done = []
                for mb in sharing.claims([own], total, []):
                    t0 = time.perf_counter()
                    time.sleep(PER_SAMPLE_S * len(mb.ids) * (factor if mb.owner == rank else 1))
                    done.append((mb, t0, time.perf_counter()))
                for mb, t0, t1 in done:
                    ids = tuple(mb.ids)
                    out.append(
                        Computed(step, rank, mb.owner, ids, mb.weight, t0, t1, sharing.one_piece)
                    )
                sharing.settle_late()
                # the gradient all-reduce, the paces reported in it: the step ends together
                sharing.exchange(lambda v: barrier.all_sum(rank, v))
        except Exception as exc:  # pragma: no cover - reported by the assertion below
            errors.append(exc)
            barrier.barrier.abort()

    threads = [threading.Thread(target=rank_loop, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return out, server


def check_every_sample_once(
    out: list[Computed], steps: int, world: int = 3, share: int = 16
) -> None:
    for step in range(steps):
        ids = Counter(i for c in out if c.step == step for i in c.ids)
        expected = {i for r in range(world) for i in own_ids(step, r, share)}
        assert set(ids) == expected and max(ids.values()) == 1, step
        weights = sum(c.weight for c in out if c.step == step)
        assert weights == pytest.approx(1.0)  # each loss weighted by its share of the total


def helped(out: list[Computed], step: int, owner: int) -> int:
    """Samples of `owner`'s share that other ranks computed in `step`."""
    return sum(len(c.ids) for c in out if c.step == step and c.owner == owner and c.rank != owner)
