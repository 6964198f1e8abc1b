"""Work sharing over real gloo ranks through the agent's step driver: one rank burns
real CPU per micro-batch (no sleep), the others take over its micro-batches; each step's
gradient still equals one process on the union of its samples (1e-6), across a plan
switch, and every sample of every step is computed, and logged, exactly once."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from antdt.runtime.servers import free_port

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.integration

TOLERANCE = 1e-6
WORLD = 3
#: Per step, per rank batch: plan 1 for steps 0-2, plan 2 (a switch) from step 3.
PLANS = [((12, 12, 12), 0), ((16, 12, 8), 3)]
STEPS = 6
SLOW_RANK = 0
POOL = 1000  # rank r takes its ids from [r * POOL, (r + 1) * POOL), in order


def _batch(step: int, rank: int) -> int:
    return max((p for p in PLANS if p[1] <= step), key=lambda p: p[1])[0][rank]


def _taken(step: int, rank: int) -> list[int]:
    start = rank * POOL + sum(_batch(k, rank) for k in range(step))
    return list(range(start, start + _batch(step, rank)))


def _data() -> tuple[Any, Any]:
    gen = torch.Generator().manual_seed(1)
    return (
        torch.randn(WORLD * POOL, 3, generator=gen, dtype=torch.float64),
        torch.randn(WORLD * POOL, 2, generator=gen, dtype=torch.float64),
    )


def _model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)
    ).double()


def _loss(model: Any, x: Any, y: Any) -> Any:
    return ((model(x) - y) ** 2).sum() / max(len(x), 1)


def _reference() -> list[list[Any]]:
    x, y = _data()
    model, grads = _model(), []
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        idx = [i for r in range(WORLD) for i in _taken(step, r)]
        _loss(model, x[idx], y[idx]).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    return grads


class _Stream:
    """The shard stream's two calls a step makes, over this rank's fixed pool of ids."""

    def __init__(self, rank: int) -> None:
        self.next = rank * POOL

    def take(self, n: int, epoch: int) -> Any:
        from antdt.agent.sampling import Taken

        ids = list(range(self.next, self.next + n))
        self.next += n
        return Taken(ids=ids)

    def synced(self, finished: list[Any]) -> None:
        pass


def _burn() -> None:
    """Real work, not a sleep: the slow rank keeps its core busy."""
    a = torch.randn(160, 160, dtype=torch.float64)
    for _ in range(30):
        a = torch.tanh(a @ a.T / 160)


def _driver(
    rank: int,
    lines: list[Any],
    plans_at: list[Any] = PLANS,
    emit: Any = lambda record: None,
    late: bool = False,
) -> Any:
    from antdt.agent.collectives import TorchCollectives
    from antdt.agent.inject import InjectionSchedule
    from antdt.agent.shared_work import sharing_for
    from antdt.agent.steps import StepDriver
    from antdt.agent.timeline import StepPlans
    from antdt.schemas import JobSpec, Plan

    plans = StepPlans("j", WORLD)
    for version, (batches, at) in enumerate(plans_at, start=1):
        plans.adopt(
            Plan(job="j", version=version, local_batch=batches, effective_step=at, created_at=0.0)
        )
    spec = JobSpec(
        job="j",
        world_size=WORLD,
        dataset_size=WORLD * POOL,
        shard_size=POOL,
        global_batch=36,
        policy_params={"work_sharing": "on", "share_chunks": 6, "share_late": late},
    )
    collectives = TorchCollectives(WORLD)
    driver = StepDriver(
        rank=rank,
        host=f"slot{rank}",
        stream=_Stream(rank),  # type: ignore[arg-type]
        plans=plans,
        collectives=lambda: collectives,
        schedule=InjectionSchedule(),
        emit=emit,
        log_ids=lines.append,
        sharing=sharing_for(spec, rank),
    )
    driver.epoch = 0
    return driver


#: Under late offers the slow rank burns only in these steps, each a burst's first: its
#: head shows it slow, so it offers its tail in the middle of the step.
BURSTS = (1, 4)


def _worker(rank: int, port: int, late: bool) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    from antdt.agent import destroy_process_group

    want, (x, y) = _reference(), _data()
    model, lines, helped = _model(), [], []
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in _driver(rank, lines, late=late).steps():
        assert step.sample_ids == _taken(step.index, rank)
        for mb in step.claims():
            if rank == SLOW_RANK and (not late or step.index in BURSTS):
                _burn()
            if mb.owner != rank:
                helped.append((step.index, mb.owner))
            (_loss(model, x[mb.ids], y[mb.ids]) * mb.weight).backward()
        step.sync(model)
        for got, w in zip([p.grad for p in model.parameters()], want[step.index], strict=True):
            diff = float((got - w).abs().max())
            assert diff < TOLERANCE, f"rank {rank} step {step.index}: gradient off by {diff}"
        opt.step()
        opt.zero_grad()
        if step.index == STEPS - 1:
            break
    logged: list[Any] = [None] * WORLD
    dist.all_gather_object(logged, ([(line.step, line.ids) for line in lines], helped))
    if rank == 0:
        for k in range(STEPS):
            seen = Counter(
                i for rank_lines, _ in logged for s, ids in rank_lines if s == k for i in ids
            )
            union = {i for r in range(WORLD) for i in _taken(k, r)}
            assert set(seen) == union and max(seen.values()) == 1, f"step {k}: {seen}"
        took = [(k, o) for r, (_, h) in enumerate(logged) if r != SLOW_RANK for k, o in h]
        assert took, "nobody helped"
        if late:  # a burst's first step: only a late offer can have handed its tail out
            assert {k for k, o in took if o == SLOW_RANK} & set(BURSTS), took
        else:
            assert not logged[SLOW_RANK][1], "the slow rank helped"
    destroy_process_group()


@pytest.mark.parametrize("late", [False, True], ids=["offers-at-step-start", "late-offers"])
def test_work_sharing_keeps_gradients_exact_and_samples_once(late: bool) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(free_port(), late), nprocs=WORLD, join=True)


ONSET, DETECT_STEPS = 24, 72  # three healthy windows of 8 steps, then a 3x slow rank 0


def _detecting_worker(rank: int, port: int) -> None:
    """Sleep-timed compute, 1 ms per sample (3 ms on rank 0 from ONSET on): what the
    monitor judges is what the step events report, whatever burns the time."""
    import time

    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    from antdt.agent import destroy_process_group
    from antdt.agent.publisher import step_event

    records: list[Any] = []
    driver = _driver(rank, [], [((12, 12, 12), 0)], records.append)
    for step in driver.steps():
        slow = rank == SLOW_RANK and step.index >= ONSET
        for mb in step.claims():
            time.sleep(len(mb.ids) * (0.003 if slow else 0.001))
        step.sync()
        if step.index == DETECT_STEPS - 1:
            break
    driver.finish(time.perf_counter())
    events = [step_event(r, "j", rank, f"slot{rank}") for r in records]
    gathered: list[Any] = [None] * WORLD
    dist.all_gather_object(gathered, events)
    if rank == 0:
        _assert_persistent(sorted((e for es in gathered for e in es), key=lambda e: e.step))
    destroy_process_group()


def _assert_persistent(events: list[Any]) -> None:
    from antdt.schemas import IncidentKind, IncidentState, StragglerClass
    from antdt.services.monitor import JobDetector

    by_fast = sum(e.samples for e in events if e.step >= ONSET and e.rank != SLOW_RANK)
    own = 12 * (WORLD - 1) * (DETECT_STEPS - ONSET)
    assert by_fast > own, "nobody took over the slow rank's micro-batches"
    for k in range(DETECT_STEPS):  # each owner's 12: its own part plus what others took
        step = {e.rank: e for e in events if e.step == k}
        helped = {r: e.helped or {} for r, e in step.items()}
        kept = {r: e.samples - sum(helped[r].values()) for r, e in step.items()}
        taken = {o: sum(h.get(o, 0) for h in helped.values()) for o in range(WORLD)}
        assert all(kept[o] + taken[o] == 12 for o in range(WORLD)), (k, kept, taken)
    detector = JobDetector("j", WORLD)
    transitions = [i for e in events for i in detector.ingest(e, e.ended_at)]
    shown = {r.rank: r.helped or {} for r in detector.health(events[-1].ended_at).ranks}
    assert sum(h.get(SLOW_RANK, 0) for h in shown.values()) >= by_fast - own
    opened = [i for i in transitions if i.state is IncidentState.OPENED]
    assert [(i.rank, i.kind) for i in opened if i.kind is IncidentKind.SLOW] == [
        (SLOW_RANK, IncidentKind.SLOW)
    ], transitions
    assert opened[0].step >= ONSET
    escalated = [i for i in transitions if i.state is IncidentState.ESCALATED]
    assert [(i.rank, i.straggler_class) for i in escalated] == [
        (SLOW_RANK, StragglerClass.PERSISTENT)
    ], transitions


def test_a_persistent_straggler_helped_by_the_others_is_still_classed_persistent() -> None:
    """With sharing, every rank's compute ends at about the same time; step events count
    the samples each rank computed, so its compute per sample is still its own speed."""
    import torch.multiprocessing as mp

    mp.spawn(_detecting_worker, args=(free_port(),), nprocs=WORLD, join=True)
