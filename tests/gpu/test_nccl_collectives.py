"""The agent's collectives under NCCL on CUDA tensors: the group formed from LOCAL_RANK
by antdt.agent.init_process_group (2 ranks with 2 GPUs or more, else 1), the sample
count and agreement, and the batch-weighted all-reduce, by hand and as DDP's hook."""

from __future__ import annotations

import os

import pytest

from antdt.runtime.servers import free_port

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.slow]

#: Per-rank sample ids of each step (uneven; the second step is a plan switch).
SPLITS = {
    1: [[list(range(7))], [list(range(7, 12))]],
    2: [[list(range(13)), list(range(13, 17))], [list(range(17, 20)), list(range(20, 31))]],
}


def _world() -> int:
    return 2 if torch.cuda.device_count() >= 2 else 1


def _join(rank: int, world: int, port: int) -> None:
    """What antdt launch or torchrun gives a rank, then the agent's own group setup."""
    for key in ("ANTDT_BACKEND", "TORCHELASTIC_USE_AGENT_STORE"):
        os.environ.pop(key, None)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.backends.cuda.matmul.allow_tf32 = False  # compared with a reference to 1e-5
    torch.backends.cudnn.allow_tf32 = False
    from antdt.agent import init_process_group

    init_process_group(timeout_s=120)


def _spawn(worker: object, world: int) -> None:
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(world, free_port()), nprocs=world, join=True)


def _model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)  # the same weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3)).to(
        device
    )


def _data(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(40, 8, generator=gen)
    y = torch.randint(0, 3, (40,), generator=gen)
    return x.to(device), y.to(device)


def _union_grads(device: torch.device, ids: list[int]) -> list[torch.Tensor]:
    """One process on all of the step's samples: the gradient every rank must end with."""
    model = _model(device)
    x, y = _data(device)
    torch.nn.functional.cross_entropy(model(x[ids]), y[ids]).backward()
    return [p.grad.clone() for p in model.parameters()]


def _assert_close(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.device == w.device, what
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=what)


def _collectives_worker(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    from antdt.agent import collective_device, destroy_process_group
    from antdt.agent.collectives import TorchCollectives

    _join(rank, world, port)
    assert dist.get_backend() == "nccl"
    assert torch.cuda.current_device() == rank  # LOCAL_RANK's GPU, not GPU 0 for all
    device = collective_device()
    assert device == torch.device("cuda", rank)
    collectives = TorchCollectives(world)
    assert collectives.device == device
    counted = collectives.all_sum([rank + 3, rank])  # the step's count, with its tail slot
    assert counted == [sum(r + 3 for r in range(world)), sum(range(world))]
    assert collectives.all_sum([0, 0]) == [0, 0]  # the end-of-epoch round: nobody has data
    big = 2**55 + rank  # a restore token's size (7 random bytes)
    assert collectives.agree_max(big) == 2**55 + world - 1
    destroy_process_group()  # only on success: a failed rank's peers would wait
    assert not dist.is_initialized()


def _weighted_worker(rank: int, world: int, port: int) -> None:
    from antdt.agent import allreduce_weighted, collective_device, destroy_process_group
    from antdt.agent.collectives import TorchCollectives

    _join(rank, world, port)
    device = collective_device()
    model = _model(device)
    x, y = _data(device)
    collectives = TorchCollectives(world)
    for k, step in enumerate(SPLITS[world]):
        ids = step[rank]
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[ids]), y[ids]).backward()
        assert collectives.reduce_gradients(model, len(ids)) == sum(len(s) for s in step)
        want = _union_grads(device, [i for part in step for i in part])
        _assert_close([p.grad for p in model.parameters()], want, f"step {k}")
    # A rank without samples sends zeros, even with NaN gradients (the mean of none).
    owner = world - 1
    ids = list(range(9)) if rank == owner else []
    model.zero_grad()
    if ids:
        torch.nn.functional.cross_entropy(model(x[ids]), y[ids]).backward()
    else:
        for p in model.parameters():
            p.grad = torch.full_like(p, float("nan"))
    assert allreduce_weighted(model, len(ids)) == 9
    _assert_close([p.grad for p in model.parameters()], _union_grads(device, list(range(9))), "0")
    destroy_process_group()


def _ddp_worker(rank: int, world: int, port: int) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from antdt.agent import (
        WeightedHookState,
        collective_device,
        destroy_process_group,
        weighted_allreduce_hook,
    )
    from antdt.agent.collectives import TorchCollectives

    _join(rank, world, port)
    device = collective_device()
    ddp = DistributedDataParallel(_model(device), device_ids=[device.index])
    state = WeightedHookState()
    ddp.register_comm_hook(state, weighted_allreduce_hook)
    x, y = _data(device)
    collectives = TorchCollectives(world)
    for k, step in enumerate(SPLITS[world]):
        ids = step[rank]
        state.update(len(ids), collectives.all_sum([len(ids), 0])[0])  # the agent's count
        ddp.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x[ids]), y[ids]).backward()
        want = _union_grads(device, [i for part in step for i in part])
        _assert_close([p.grad for p in ddp.parameters()], want, f"ddp step {k}")
    destroy_process_group()


def _count_only_worker(rank: int, world: int, port: int) -> None:
    from antdt.agent import allreduce_weighted, destroy_process_group

    _join(rank, world, port)
    assert allreduce_weighted([], rank + 1) == sum(r + 1 for r in range(world))
    destroy_process_group()


def test_the_group_binds_each_rank_to_its_gpu_and_counts_on_it() -> None:
    _spawn(_collectives_worker, _world())


def test_uneven_batches_give_the_union_mean_gradient_on_cuda() -> None:
    _spawn(_weighted_worker, _world())


def test_ddp_with_the_weighted_hook_gives_the_union_mean_gradient_on_cuda() -> None:
    _spawn(_ddp_worker, _world())


def test_a_model_without_trainable_parameters_still_counts_under_nccl() -> None:
    _spawn(_count_only_worker, _world())
