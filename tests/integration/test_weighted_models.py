"""`weighted(model, state)` over real gloo ranks: DDP's all-reduce and FSDP2's reduce-scatter,
batch-weighted, train the same parameters as one process on the union of each step's
samples with the plain mean, with uneven batches, micro-batches accumulated without
sync, a plan switch mid-run and a rank with no samples.

Each spawned rank checks its own parameters after every step against a single-process
reference (float64), so a failure surfaces as the rank's traceback."""

from __future__ import annotations

from typing import Any

import pytest

from antdt.runtime.servers import free_port

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.integration

TOLERANCE = 1e-6
LR = 0.1
Schedule = list[list[tuple[int, int]]]
#: Per step: each rank's (local batch, micro-batch; 0: the whole batch). Step 2 switches
#: the plan (new batches and micro-batches); rank 1 has no samples at step 3.
THREE_RANKS: Schedule = [
    [(5, 0), (7, 0), (1, 0)],
    [(5, 2), (7, 3), (1, 0)],
    [(2, 2), (9, 4), (2, 0)],
    [(3, 0), (0, 0), (8, 3)],
    [(3, 1), (0, 0), (8, 0)],
]
#: For HSDP on a 2 x 2 mesh (replicate x shard): the same kinds of steps over four ranks.
FOUR_RANKS: Schedule = [
    [(5, 0), (7, 0), (1, 0), (4, 0)],
    [(5, 2), (7, 3), (1, 0), (4, 4)],
    [(2, 2), (9, 4), (2, 0), (0, 0)],
    [(6, 5), (1, 0), (0, 0), (3, 1)],
]


def _data() -> tuple[Any, Any]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(128, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(128, 2, generator=gen, dtype=torch.float64)
    return x, y


def _model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)
    ).double()


def _rows(schedule: Schedule) -> list[list[list[list[int]]]]:
    """Per step, per rank: the sample indices of each micro-batch (consecutive, like a
    shard), as `step.micro_batches` gives them: none for a rank with no samples."""
    out, cursor = [], 0
    for plan in schedule:
        row = []
        for n, micro in plan:
            ids = list(range(cursor, cursor + n))
            cursor += n
            size = micro or max(n, 1)
            row.append([ids[i : i + size] for i in range(0, n, size)])
        out.append(row)
    return out


def _reference(schedule: Schedule) -> list[list[Any]]:
    """Parameters after each step of one process training on the union, plain mean."""
    x, y = _data()
    model, after = _model(), []
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for row in _rows(schedule):
        idx = [i for chunks in row for chunk in chunks for i in chunk]
        ((model(x[idx]) - y[idx]) ** 2).sum().div(len(idx)).backward()
        opt.step()
        opt.zero_grad()
        after.append([p.detach().clone() for p in model.parameters()])
    return after


def _train(rank: int, schedule: Schedule, model: Any, full: Any, what: str) -> None:
    """The documented loop: the agent's count all-reduce sets the state before compute;
    each micro-batch's loss is its share of the rank's mean; `accumulate` pads the
    micro-batches to the most any rank has and reduces in the last one only."""
    from antdt.agent import WeightedHookState, accumulate, weighted
    from antdt.agent.collectives import TorchCollectives

    x, y = _data()
    state = WeightedHookState()
    weighted(model, state)
    collectives = TorchCollectives(torch.distributed.get_world_size())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for k, (row, want) in enumerate(zip(_rows(schedule), _reference(schedule), strict=True)):
        chunks = row[rank]
        local = sum(len(c) for c in chunks)
        state.update(local, collectives.all_sum([local])[0])
        for chunk in accumulate(model, chunks):
            ((model(x[chunk]) - y[chunk]) ** 2).sum().div(max(local, 1)).backward()
        opt.step()
        opt.zero_grad()
        for got, w in zip((full(p) for p in model.parameters()), want, strict=True):
            diff = float((got - w).abs().max())
            assert diff < TOLERANCE, f"{what} step {k}: parameters differ by {diff}"


def _train_ddp(rank: int, schedule: Schedule) -> None:
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_model())
    _train(rank, schedule, model, lambda p: p.detach(), "ddp")


def _train_fsdp(rank: int, schedule: Schedule, shape: tuple[int, ...]) -> None:
    """FSDP2 on a 1-D mesh; HSDP on a 2-D one (replicate x shard)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    names = ("shard",) if len(shape) == 1 else ("replicate", "shard")
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    model = _model()
    for module in (model[0], model[2], model):
        fully_shard(module, mesh=mesh)
    what = "fsdp2" if len(shape) == 1 else "hsdp"
    _train(rank, schedule, model, lambda p: p.full_tensor().detach(), what)


def _worker(rank: int, world: int, port: int, schedule: Schedule, shape: tuple[int, ...]) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    from antdt.agent import destroy_process_group

    _train_ddp(rank, schedule)
    _train_fsdp(rank, schedule, shape)
    destroy_process_group()  # only on success: a failed rank's peers would wait


def _spawn(schedule: Schedule, shape: tuple[int, ...]) -> None:
    import torch.multiprocessing as mp

    world = len(schedule[0])
    mp.spawn(_worker, args=(world, free_port(), schedule, shape), nprocs=world, join=True)


def test_weighted_ddp_and_fsdp2_train_like_one_process_on_the_union() -> None:
    _spawn(THREE_RANKS, (3,))


def test_weighted_ddp_and_hsdp_train_like_one_process_on_the_union() -> None:
    _spawn(FOUR_RANKS, (2, 2))


def test_weighted_refuses_a_model_without_its_own_reduction() -> None:
    from antdt.agent import WeightedHookState, weighted

    with pytest.raises(TypeError, match="fully_shard"):
        weighted(_model(), WeightedHookState())
