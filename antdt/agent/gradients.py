"""Batch-weighted gradient averaging: every step's update is the mean gradient over all
samples of the step, whatever the per-rank batch sizes, so moving samples between ranks
needs no learning-rate change. Two ways: `allreduce_weighted` after backward, or the
model's own reduction made weighted by `weighted(model, state)`: DDP's all-reduce or
FSDP2's reduce-scatter (docs/architecture.md, gradient weighting).
torch is imported inside the functions: importing this module does not need torch."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import torch
    from torch.distributed import GradBucket

#: The SUM of a flat buffer over the ranks, in place.
Exchange = Callable[[Any], None]


def trainable(params: Any) -> list[torch.Tensor]:
    """The parameters that take gradients, from a module (DDP or not) or an iterable."""
    if hasattr(params, "parameters"):
        params = params.parameters()
    return [p for p in params if p.requires_grad]


def _buffer_dtype(params: list[torch.Tensor]) -> torch.dtype:
    import torch

    dtype = params[0].dtype
    for p in params[1:]:
        dtype = torch.promote_types(dtype, p.dtype)
    # Half-precision sums of n_i * g_i lose too much; reduce them in float32.
    return dtype if torch.finfo(dtype).bits >= 32 else torch.float32


def _by_device(params: list[torch.Tensor]) -> dict[Any, list[torch.Tensor]]:
    groups: dict[Any, list[torch.Tensor]] = {}
    for p in params:
        groups.setdefault(p.device, []).append(p)
    return groups


def _reduce_group(
    params: list[torch.Tensor],
    n: int,
    group: Any,
    extras: Sequence[int] = (),
    exchange: Exchange | None = None,
) -> tuple[float, list[int]]:
    import torch
    import torch.distributed as dist

    numel = sum(p.numel() for p in params)
    flat = torch.zeros(
        numel + 1 + len(extras), dtype=_buffer_dtype(params), device=params[0].device
    )
    if extras:
        flat[numel + 1 :] = torch.tensor(extras, dtype=flat.dtype)
    if n > 0:  # a rank without samples sends zeros even if its grads hold NaN (mean of none)
        offset = 0
        for p in params:
            if p.grad is not None:
                if p.grad.is_sparse:
                    raise ValueError("sparse gradients are not supported")
                flat[offset : offset + p.numel()].copy_(p.grad.reshape(-1))
            offset += p.numel()
        flat[:numel].mul_(n)
    flat[numel] = n
    if dist.is_available() and dist.is_initialized():
        if exchange is not None:
            exchange(flat)
        else:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    total = float(flat[numel].item())
    if total > 0:
        flat[:numel].div_(total)
    offset = 0
    for p in params:
        mean = flat[offset : offset + p.numel()].view(p.shape)
        offset += p.numel()
        if p.grad is None:
            # Set it anyway: every rank must hold the same gradients or the replicas drift.
            p.grad = mean.to(p.dtype).clone()
        else:
            p.grad.copy_(mean)
    return total, [round(v) for v in flat[numel + 1 :].tolist()] if extras else []


def allreduce_weighted(params: Iterable[Any] | Any, local_samples: int, group: Any = None) -> int:
    """Replace every rank's gradients by the mean over all samples of the step; returns
    the step's total sample count. `params`: a module (DDP or not) or its parameters,
    whose grads are the mean over this rank's `local_samples` (None grads count as zeros).
    One flat SUM all-reduce of [g*n, n] per device; no process group: a world of one."""
    return allreduce_weighted_with(params, local_samples, (), group)[0]


def allreduce_weighted_with(
    params: Iterable[Any] | Any,
    local_samples: int,
    extras: Sequence[int],
    group: Any = None,
    exchange: Exchange | None = None,
) -> tuple[int, list[int]]:
    """`allreduce_weighted`, with `extras` (integers; in a float32 buffer exact below
    2**24, within 1e-7 above) summed over the ranks in the same all-reduce: a few numbers
    more cost no latency there, where an all-reduce of their own would (work sharing's
    exchange). `exchange`: the SUM of each flat buffer over the ranks, if not the group's
    all-reduce (routing.py). Returns the step's total and the summed extras."""
    if local_samples < 0:
        raise ValueError("local_samples must be >= 0")
    params = trainable(params)
    if not params:
        summed = _count_only([local_samples, *extras], group)
        return summed[0], summed[1:]
    groups = list(_by_device(params).values())
    total, summed = _reduce_group(groups[0], local_samples, group, extras, exchange)
    for ps in groups[1:]:
        _reduce_group(ps, local_samples, group, (), exchange)
    return round(total), summed


def scale_gradients(params: Iterable[Any] | Any, factor: float) -> None:
    """Multiply every gradient of `params` by `factor` (None grads stay None)."""
    for p in trainable(params):
        if p.grad is not None:
            p.grad.mul_(factor)


def _count_only(values: list[int], group: Any) -> list[int]:
    import torch
    import torch.distributed as dist

    from antdt.agent.devices import collective_device

    initialized = dist.is_available() and dist.is_initialized()
    device = collective_device(group) if initialized else "cpu"
    count = torch.tensor(values, dtype=torch.int64, device=device)  # under nccl: on the GPU
    if initialized:
        dist.all_reduce(count, op=dist.ReduceOp.SUM, group=group)
    return [int(v) for v in count.tolist()]


@dataclass
class WeightedHookState:
    """What `weighted_allreduce_hook` needs each step: this rank's samples and the step's
    total over all ranks (from the agent's count all-reduce, known before backward)."""

    local_samples: int = 0
    total_samples: int = 0
    process_group: Any = None

    def update(self, local_samples: int, total_samples: int) -> None:
        self.local_samples, self.total_samples = local_samples, total_samples


def _weigh(tensor: torch.Tensor, state: WeightedHookState) -> None:
    """Scale this rank's summed-to-be gradients by n_i / B, in place (zeros for n_i = 0,
    even over NaN: the mean over no samples)."""
    if state.total_samples <= 0:
        raise RuntimeError("WeightedHookState.total_samples is not set for this step")
    if state.local_samples == 0:
        tensor.zero_()
    else:
        tensor.mul_(state.local_samples / state.total_samples)


# `bucket` and the return (torch.futures.Future[torch.Tensor]) are left unannotated on
# purpose: DDP compares the annotations with the real classes, and under
# `from __future__ import annotations` they would be strings and fail that check.
def weighted_allreduce_hook(state: WeightedHookState, bucket):  # type: ignore[no-untyped-def]
    """DDP communication hook: scales each rank's bucket by n_i / B before the SUM, so
    the result is sum_i n_i g_i / B, the mean over the step's B samples. Register with
    `ddp.register_comm_hook(state, weighted_allreduce_hook)` (or `weighted(ddp, state)`)."""
    import torch.distributed as dist

    bucket = cast("GradBucket", bucket)
    tensor = bucket.buffer()
    _weigh(tensor, state)
    work = dist.all_reduce(tensor, group=state.process_group, async_op=True)
    assert work is not None
    return work.get_future().then(lambda fut: fut.value()[0])


class WeightedReduceScatter:
    """FSDP2 reduce-scatter that scales this rank's gradients by n_i / B, then SUMs. It
    implements FSDP's `ReduceScatter` comm (allocate, call) by duck typing: that base
    class lives in a private torch module. `weighted` sets it with FSDP's own division
    off, so the shard's gradient is sum_i n_i g_i / B."""

    def __init__(self, state: WeightedHookState) -> None:
        self.state = state

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> Any:
        import torch

        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        import torch.distributed as dist

        _weigh(input_tensor, self.state)
        # reduce_scatter_single: the newer name of reduce_scatter_tensor (deprecated).
        reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        return reduce_scatter(
            output_tensor, input_tensor, op=dist.ReduceOp.SUM, group=group, async_op=async_op
        )


def weighted(model: Any, state: WeightedHookState) -> Any:
    """Make `model`'s own gradient reduction batch-weighted by `state` (updated every step
    before backward) and return it: a DistributedDataParallel gets
    `weighted_allreduce_hook`; a module sharded by FSDP2's `fully_shard` gets
    `WeightedReduceScatter` on each of its FSDP modules, with FSDP's division off."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        model.register_comm_hook(state, weighted_allreduce_hook)
        return model
    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not sharded:
        raise TypeError(
            f"weighted() takes a DistributedDataParallel or a module sharded with "
            f"fully_shard, not {type(model).__name__}: reduce a plain module's gradients "
            "with step.sync(model)"
        )
    if not hasattr(sharded[0], "set_force_sum_reduction_for_comms"):
        raise RuntimeError("FSDP2 weighting needs a newer torch (tested with 2.13)")
    for module in sharded:
        module.set_gradient_divide_factor(1.0)  # no division by the world size ...
        module.set_force_sum_reduction_for_comms(True)  # ... nor an AVG or PREMUL_SUM op
        module.set_custom_reduce_scatter(WeightedReduceScatter(state))  # type: ignore[arg-type]
    return model
