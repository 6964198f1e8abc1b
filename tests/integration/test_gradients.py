"""Batch-weighted gradients over real gloo ranks equal one process on the union of samples.

Each spawned rank checks its own result against a single-process reference (float64), so
a failure surfaces as the rank's traceback through torch.multiprocessing."""

from __future__ import annotations

from typing import Any

import pytest

from antdt.runtime.servers import free_port

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.integration

TOLERANCE = 1e-6
#: Per step, per rank sample counts: unequal, a plan switch, then a rank with none.
FOUR_RANKS = [[5, 7, 1, 3], [2, 2, 8, 4], [3, 0, 6, 1]]
TWO_RANKS = [[3, 9], [0, 4], [6, 6]]


def _data() -> tuple[Any, Any]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(64, 2, generator=gen, dtype=torch.float64)
    return x, y


def _model() -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)
    ).double()
    return model


def _loss(model: Any, x: Any, y: Any) -> Any:
    # Mean over this rank's samples; a rank with none gets a zero loss (not NaN).
    return ((model(x) - y) ** 2).sum() / max(len(x), 1)


def _slices(steps: list[list[int]]) -> list[list[range]]:
    """Which sample indices each rank gets at each step (consecutive, like a shard)."""
    out, cursor = [], 0
    for batches in steps:
        row = []
        for n in batches:
            row.append(range(cursor, cursor + n))
            cursor += n
        out.append(row)
    return out


def _reference(steps: list[list[int]]) -> list[list[Any]]:
    """Gradients of one process training on the union of each step's samples."""
    x, y = _data()
    model, grads = _model(), []
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for row in _slices(steps):
        idx = [i for r in row for i in r]
        _loss(model, x[idx], y[idx]).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    return grads


def _check(got: list[Any], want: list[Any], what: str) -> None:
    for g, w in zip(got, want, strict=True):
        diff = float((g - w).abs().max())
        assert diff < TOLERANCE, f"{what}: gradient differs by {diff}"


def _train_plain(rank: int, steps: list[list[int]], want: list[list[Any]]) -> None:
    from antdt.agent.gradients import allreduce_weighted, allreduce_weighted_with

    x, y = _data()
    model = _model()
    unused = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    world = len(steps[0])
    for k, row in enumerate(_slices(steps)):
        idx = list(row[rank])
        if idx:  # the script skips compute on an empty batch; grads stay None
            _loss(model, x[idx], y[idx]).backward()
        params = [*model.parameters(), unused]
        if k % 2:  # with a report appended (work sharing's): summed, gradients the same
            report = [0] * (2 * world)
            report[rank], report[world + rank] = 1000 * rank + k, 2**30 + rank
            total, summed = allreduce_weighted_with(params, len(idx), report)
            assert summed == [1000 * r + k for r in range(world)] + [
                2**30 + r for r in range(world)
            ]
        else:
            total = allreduce_weighted(params, len(idx))
        assert total == sum(steps[k])
        _check([p.grad for p in model.parameters()], want[k], f"plain step {k}")
        assert unused.grad is not None and float(unused.grad.abs().max()) == 0.0
        opt.step()
        opt.zero_grad()


def _train_routed(rank: int, steps: list[list[int]], want: list[list[Any]]) -> None:
    """The exchange routed around each step's offering ranks (routing.py): the same
    gradients and report sums as the ring, and every rank's gradients bit for bit the
    same (the replicas must not drift)."""
    import torch.distributed as dist

    from antdt.agent.collectives import TorchCollectives

    x, y = _data()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    world = len(steps[0])
    collectives = TorchCollectives(world)
    offers = [frozenset({world - 1}), frozenset({0, world - 2}), frozenset(range(world))]
    for k, row in enumerate(_slices(steps)):
        idx = list(row[rank])
        if idx:
            _loss(model, x[idx], y[idx]).backward()
        report = [0] * world
        report[rank] = 7 * rank + k
        summed = collectives.reduce_gradients_and_sum(model, len(idx), report, offers[k])
        assert summed == [7 * r + k for r in range(world)]
        assert collectives.all_sum([rank, 1], offers[k]) == [sum(range(world)), world]
        _check([p.grad for p in model.parameters()], want[k], f"routed step {k}")
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        everyone = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(everyone, flat)
        assert all(torch.equal(flat, other) for other in everyone), f"routed step {k}"
        opt.step()
        opt.zero_grad()
    # one subgroup per set of offers that left a rank out; none where every rank offered
    assert len(collectives._routes._subgroups) == len({offers[0], offers[1]})


def _train_ddp(rank: int, steps: list[list[int]], want: list[list[Any]]) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from antdt.agent.gradients import WeightedHookState, weighted_allreduce_hook

    x, y = _data()
    ddp = DistributedDataParallel(_model())
    state = WeightedHookState()
    ddp.register_comm_hook(state, weighted_allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for k, row in enumerate(_slices(steps)):
        idx = list(row[rank])
        count = torch.tensor([len(idx)], dtype=torch.int64)
        dist.all_reduce(count)  # what the agent's count all-reduce does before compute
        state.update(len(idx), int(count.item()))
        _loss(ddp, x[idx], y[idx]).backward()  # every rank runs backward under DDP
        _check([p.grad for p in ddp.parameters()], want[k], f"ddp step {k}")
        opt.step()
        opt.zero_grad()


def _worker(rank: int, world: int, port: int, steps: list[list[int]]) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    from antdt.agent import destroy_process_group

    want = _reference(steps)
    _train_plain(rank, steps, want)
    _train_routed(rank, steps, want)
    _train_ddp(rank, steps, want)
    destroy_process_group()  # only on success: a failed rank's peers would wait


@pytest.mark.parametrize("steps", [FOUR_RANKS, TWO_RANKS], ids=["4-ranks", "2-ranks"])
def test_weighted_gradients_equal_the_union(steps: list[list[int]]) -> None:
    import torch.multiprocessing as mp

    world = len(steps[0])
    mp.spawn(_worker, args=(world, free_port(), steps), nprocs=world, join=True)


def test_world_of_one_without_process_group_is_a_plain_mean() -> None:
    from antdt.agent.gradients import allreduce_weighted

    x, y = _data()
    model = _model()
    _loss(model, x[:6], y[:6]).backward()
    before = [p.grad.clone() for p in model.parameters()]
    assert allreduce_weighted(model, 6) == 6
    _check([p.grad for p in model.parameters()], before, "world of one")
    assert allreduce_weighted([], 3) == 3
    with pytest.raises(ValueError):
        allreduce_weighted(model, -1)
