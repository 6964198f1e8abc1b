"""torch.distributed's default process group from the launcher's environment (torchrun's
or `antdt launch`'s): the backend and the rank's CUDA device chosen by
antdt.agent.devices, a per-restart store under single-node torchrun, and a clean exit."""

from __future__ import annotations

import os
from typing import Any

from antdt.agent.devices import (
    choose_backend,
    collective_device,
    cuda_device_count,
    rank_cuda_index,
)


def init_process_group(backend: str | None = None, timeout_s: float = 1800.0) -> None:
    """torch.distributed from the env (RANK, WORLD_SIZE, MASTER_ADDR/PORT, LOCAL_RANK).
    `backend` (else ANTDT_BACKEND): default nccl when this node has a GPU per rank, else
    gloo. Under nccl the rank's CUDA device is LOCAL_RANK: set current and bound to the
    group (`device_id`) before any collective. A no-op when already initialised."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    rank = os.environ.get("RANK") or os.environ.get("ANTDT_RANK")
    world = os.environ.get("WORLD_SIZE") or os.environ.get("ANTDT_WORLD_SIZE")
    if rank is None or world is None or "MASTER_PORT" not in os.environ:
        raise RuntimeError("RANK, WORLD_SIZE and MASTER_ADDR/MASTER_PORT must be set")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    gpus = cuda_device_count()
    chosen = choose_backend(backend, os.environ, gpus)
    local_rank = int(os.environ.get("LOCAL_RANK") or os.environ.get("ANTDT_LOCAL_RANK") or 0)
    index = rank_cuda_index(chosen, local_rank, gpus)
    device_id = None
    if index is not None:
        torch.cuda.set_device(index)
        device_id = torch.device("cuda", index)
    timeout = timedelta(seconds=timeout_s)
    store = _agent_store(timeout)
    dist.init_process_group(
        backend=chosen,
        init_method=None if store is not None else "env://",
        store=store,
        rank=int(rank),
        world_size=int(world),
        timeout=timeout,
        device_id=device_id,
    )


def _agent_store(timeout: Any) -> Any:
    """Under single-node torchrun, whose agent keeps one store for every restart of the
    group: that store, under a prefix per restart. Unprefixed, a restarted rank may read
    a dead one's address and fail to connect (pytorch/pytorch#135712). None otherwise:
    restart counts are per node, so across nodes they would split the group."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    if os.environ.get("GROUP_WORLD_SIZE", "1") != "1":
        return None
    import torch.distributed as dist

    client = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"antdt/restart{restart}", client)


def destroy_process_group() -> None:
    """Leave torch.distributed cleanly: a barrier, then destroy (a no-op when not
    initialised). After the barrier every rank is past its last collective, so no gloo
    rank tears its pairs down under a peer still in one (which aborts that peer). Under
    nccl the barrier names the rank's device (torch would otherwise guess one)."""
    import gc

    import torch.distributed as dist

    if not dist.is_initialized():
        return
    gc.collect()  # a DDP reducer caught in a cycle still holds work on the group
    device = collective_device()
    dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)
    dist.destroy_process_group()
