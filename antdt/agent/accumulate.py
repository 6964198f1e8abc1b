"""Gradient accumulation over a step's micro-batches for a model that reduces its own
gradients (DDP, FSDP2): the reduction waits for the last micro-batch, and every rank runs
as many forward/backward passes as the rank with the most micro-batches, because FSDP2's
forward all-gathers (and DDP's broadcasts buffers): unequal counts would hang. A plain
module passes through (its chunks padded the same way)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any


def accumulate(
    model: Any, micro_batches: list[list[int]], group: Any = None
) -> Iterator[list[int]]:
    """Yield this rank's micro-batches (e.g. `step.micro_batches`), padded with empty ones
    up to the most any rank has (one collective MAX per step); the model's reduction runs
    in the last one's backward only. Run forward and backward on each, with a loss that is
    0 on an empty one: the chunk's summed loss divided by the step's local sample count."""
    chunks = list(micro_batches)
    wanted = _most_over_ranks(max(len(chunks), 1), _device(model), group)
    chunks += [[] for _ in range(wanted - len(chunks))]
    for i, chunk in enumerate(chunks):
        with _held_back(model) if i < len(chunks) - 1 else nullcontext():
            yield chunk


def _most_over_ranks(count: int, device: Any, group: Any) -> int:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return count
    tensor = torch.tensor([count], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return int(tensor.item())


def _device(model: Any) -> Any:
    """Where the count goes: the model's (NCCL needs CUDA tensors), else the CPU."""
    param = next(iter(model.parameters()), None)
    return param.device if param is not None else "cpu"


def _held_back(model: Any) -> AbstractContextManager[None]:
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return model.no_sync()
    from torch.distributed.fsdp import FSDPModule  # torch >= 2.6: imported only for FSDP2

    if isinstance(model, FSDPModule):
        return _fsdp_no_sync(model)
    return nullcontext()  # a plain module: step.sync(model) reduces after the last chunk


@contextmanager
def _fsdp_no_sync(model: Any) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
