"""The two collectives a step needs: the sample count (`all_sum`: every rank learns the
step's total, whether the epoch is over, and whether a rank ran dry) and the weighted
gradient exchange.

A seam, so that the agent's own tests can run several ranks in one process without
torch.distributed; training always uses TorchCollectives."""

from __future__ import annotations

from functools import partial
from typing import Any, Protocol

from antdt.agent.routing import Posts, RoutedExchange


class Collectives(Protocol):
    def reduce_gradients(self, model: Any, local_samples: int) -> int:
        """Batch-weighted gradient mean over all ranks; returns the step's total."""
        ...

    def reduce_gradients_and_sum(
        self,
        model: Any,
        local_samples: int,
        values: list[int],
        around: frozenset[int] = frozenset(),
    ) -> list[int]:
        """`reduce_gradients`, with the element-wise SUM of every rank's `values` (same
        length everywhere) in the same exchange: work sharing's pace report. `around`:
        the step's offering ranks (the same on every rank), whom the exchange is routed
        around (routing.py)."""
        ...

    def agree_max(self, value: int) -> int:
        """MAX of value over all ranks: how the ranks of a restart agree on its token."""
        ...

    def all_sum(
        self, values: list[int], around: frozenset[int] = frozenset(), posts: Posts | None = None
    ) -> list[int]:
        """Element-wise SUM of every rank's `values` (same length everywhere): work
        sharing's count, with each rank's samples and pace in its own slots. `around`:
        as in `reduce_gradients_and_sum`; `posts`: the legs between the offering ranks and
        their partners go through it (the count)."""
        ...


class TorchCollectives:
    """torch.distributed on the default (or given) process group. Its tensors live on
    the group's collective device (antdt.agent.devices): the rank's GPU under nccl."""

    def __init__(self, world_size: int, group: Any = None) -> None:
        import torch.distributed as dist

        from antdt.agent.devices import collective_device

        self._dist = dist
        self._group = group
        self._initialized = dist.is_available() and dist.is_initialized()
        if world_size > 1 and not self._initialized:
            raise RuntimeError(
                f"a job of {world_size} ranks needs torch.distributed initialised before "
                "the first step: call antdt.agent.init_process_group() (or your own "
                "torch.distributed.init_process_group)"
            )
        self.device = collective_device(group)
        initialized = self._initialized
        rank, world = (dist.get_rank(), dist.get_world_size()) if initialized else (0, 1)
        backend = str(dist.get_backend()) if initialized else ""
        self._routes = RoutedExchange(rank, world, backend, group)

    def all_sum(
        self, values: list[int], around: frozenset[int] = frozenset(), posts: Posts | None = None
    ) -> list[int]:
        if not self._initialized:
            return list(values)
        import torch

        tensor = torch.tensor(values, dtype=torch.int64, device=self.device)
        self._routes.all_reduce(tensor, around, posts)
        return [int(v) for v in tensor.tolist()]

    def agree_max(self, value: int) -> int:
        if not self._initialized:
            return value
        import torch

        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        self._dist.all_reduce(tensor, op=self._dist.ReduceOp.MAX, group=self._group)
        return int(tensor.item())

    def reduce_gradients(self, model: Any, local_samples: int) -> int:
        from antdt.agent.gradients import allreduce_weighted

        return allreduce_weighted(model, local_samples, group=self._group)

    def reduce_gradients_and_sum(
        self,
        model: Any,
        local_samples: int,
        values: list[int],
        around: frozenset[int] = frozenset(),
    ) -> list[int]:
        from antdt.agent.gradients import allreduce_weighted_with

        exchange = partial(self._routes.all_reduce, offering=around)
        return allreduce_weighted_with(model, local_samples, values, self._group, exchange)[1]
