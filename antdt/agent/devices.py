"""Which backend a rank's process group uses and on which device its collectives' tensors
live. The choices are pure functions of the environment and what the machine has; the
few calls that read torch's state are at the end. Importing this module does not import
torch (docs/architecture.md, "Devices and NCCL")."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: Backends whose collectives take CUDA tensors only.
CUDA_ONLY = frozenset({"nccl"})
#: Backends a user may name (ANTDT_BACKEND or the argument).
KNOWN = frozenset({"gloo", "nccl", "mpi", "ucc"})


def choose_backend(requested: str | None, env: Mapping[str, str], cuda_devices: int) -> str:
    """The process group's backend: `requested`, else ANTDT_BACKEND, else nccl when this
    node has a GPU for each of its ranks (LOCAL_WORLD_SIZE), else gloo. Raises ValueError
    for an unknown name, or nccl without enough GPUs (two ranks cannot share one)."""
    name = (requested or env.get("ANTDT_BACKEND") or "").strip().lower()
    local_world = int(env.get("LOCAL_WORLD_SIZE") or 1)
    if not name:
        return "nccl" if cuda_devices >= local_world else "gloo"
    if name not in KNOWN:
        raise ValueError(f"backend {name!r}: choose one of {', '.join(sorted(KNOWN))}")
    if name in CUDA_ONLY and cuda_devices < local_world:
        raise ValueError(
            f"backend {name} needs a CUDA device per rank: {local_world} ranks on this node, "
            f"{cuda_devices} CUDA devices visible"
        )
    return name


def rank_cuda_index(backend: str, local_rank: int, cuda_devices: int) -> int | None:
    """The CUDA device this rank binds to (LOCAL_RANK), or None: only a CUDA-only backend
    binds one. Raises ValueError when LOCAL_RANK names a device that is not there."""
    if backend not in CUDA_ONLY:
        return None
    if not 0 <= local_rank < cuda_devices:
        raise ValueError(
            f"LOCAL_RANK {local_rank} has no CUDA device ({cuda_devices} visible): "
            "one rank per GPU, LOCAL_RANK numbering them from 0"
        )
    return local_rank


def collective_device_type(backend: str) -> str:
    """Where small tensors of a group on `backend` must live: "cuda" or "cpu". `backend`
    as torch names it, "nccl" or a per-device mapping such as "cpu:gloo,cuda:nccl" (a
    group with a CPU backend keeps its counts on the CPU)."""
    if ":" in backend:
        devices = {part.split(":", 1)[0].strip() for part in backend.split(",")}
        return "cpu" if "cpu" in devices else "cuda"
    return "cuda" if backend.strip().lower() in CUDA_ONLY else "cpu"


def model_device(requested: str, backend: str | None, local_rank: int) -> str:
    """A rank's model device: `requested` ("cpu", "cuda" for cuda:LOCAL_RANK, "cuda:N")
    or, for "auto" or "", its collectives' device (cuda:LOCAL_RANK under nccl, else cpu;
    `backend` None: no process group)."""
    requested = requested.strip().lower()
    if requested in ("", "auto"):
        gpu = backend is not None and collective_device_type(backend) == "cuda"
        return f"cuda:{local_rank}" if gpu else "cpu"
    if requested == "cuda":
        return f"cuda:{local_rank}"
    if requested == "cpu" or requested.startswith("cuda:"):
        return requested
    raise ValueError(f"device {requested!r}: use auto, cpu, cuda or cuda:N")


# -- what reads torch's state ---------------------------------------------------------


def cuda_device_count() -> int:
    """CUDA devices this process sees (0 without a CUDA build of torch)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def collective_device(group: Any = None) -> torch.device:
    """The device for the tensors of `group`'s collectives (default group: None): the
    rank's current CUDA device under nccl, else the CPU, also when torch.distributed is
    not initialised (a world of one)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return torch.device("cpu")
    if collective_device_type(str(dist.get_backend(group))) == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def wait_for_device() -> None:
    """Wait until the work queued on the current CUDA device is done; a no-op where CUDA
    was never used (so a clock read after it times the compute, not its launch)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
