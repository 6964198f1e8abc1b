"""antdt.agent.devices: the backend and device choices (pure, every machine), and the
process group and collectives on a 1-rank gloo group (CPU, every machine)."""

from __future__ import annotations

import pytest

from antdt.agent.devices import (
    choose_backend,
    collective_device_type,
    model_device,
    rank_cuda_index,
)
from antdt.runtime.servers import free_port


def test_the_backend_is_nccl_only_with_a_gpu_for_every_local_rank() -> None:
    assert choose_backend(None, {}, cuda_devices=0) == "gloo"
    assert choose_backend(None, {}, cuda_devices=1) == "nccl"
    assert choose_backend(None, {"LOCAL_WORLD_SIZE": "8"}, cuda_devices=8) == "nccl"
    # four ranks on a one-GPU laptop (the demo): gloo, not four ranks on one GPU
    assert choose_backend(None, {"LOCAL_WORLD_SIZE": "4"}, cuda_devices=1) == "gloo"


def test_the_argument_outranks_antdt_backend_which_outranks_the_default() -> None:
    env = {"ANTDT_BACKEND": "gloo", "LOCAL_WORLD_SIZE": "2"}
    assert choose_backend(None, env, cuda_devices=2) == "gloo"
    assert choose_backend("NCCL", env, cuda_devices=2) == "nccl"
    assert choose_backend("", {"ANTDT_BACKEND": " Gloo "}, cuda_devices=4) == "gloo"


def test_nccl_without_a_gpu_per_rank_or_an_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a CUDA device per rank: 1 ranks on this node, 0"):
        choose_backend("nccl", {}, cuda_devices=0)
    with pytest.raises(ValueError, match="2 ranks on this node, 1 CUDA"):
        choose_backend(None, {"ANTDT_BACKEND": "nccl", "LOCAL_WORLD_SIZE": "2"}, 1)
    with pytest.raises(ValueError, match="backend 'nccll'"):
        choose_backend("nccll", {}, cuda_devices=1)


def test_only_nccl_binds_the_rank_to_the_gpu_of_its_local_rank() -> None:
    assert rank_cuda_index("nccl", 3, cuda_devices=8) == 3
    assert rank_cuda_index("gloo", 3, cuda_devices=8) is None
    with pytest.raises(ValueError, match="LOCAL_RANK 2 has no CUDA device"):
        rank_cuda_index("nccl", 2, cuda_devices=2)
    with pytest.raises(ValueError, match="LOCAL_RANK -1"):
        rank_cuda_index("nccl", -1, cuda_devices=2)


def test_collective_tensors_live_on_the_gpu_only_when_no_cpu_backend_serves_the_group() -> None:
    assert collective_device_type("nccl") == "cuda"
    assert collective_device_type("NCCL") == "cuda"
    assert collective_device_type("gloo") == "cpu"
    assert collective_device_type("mpi") == "cpu"
    assert collective_device_type("cpu:gloo,cuda:nccl") == "cpu"
    assert collective_device_type("cuda:nccl") == "cuda"


def test_the_model_device_follows_the_group_unless_asked() -> None:
    assert model_device("auto", "nccl", 2) == "cuda:2"
    assert model_device("", "gloo", 2) == "cpu"
    assert model_device("auto", None, 0) == "cpu"
    assert model_device("cuda", "gloo", 1) == "cuda:1"
    assert model_device("CPU", "nccl", 1) == "cpu"
    assert model_device("cuda:5", "nccl", 1) == "cuda:5"
    with pytest.raises(ValueError, match="device 'gpu'"):
        model_device("gpu", "nccl", 0)


def _rank_env(monkeypatch: pytest.MonkeyPatch, **extra: str) -> None:
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    for key, value in {**env, "MASTER_ADDR": "127.0.0.1", **extra}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    monkeypatch.delenv("ANTDT_BACKEND", raising=False)


def test_nccl_asked_for_with_too_few_gpus_fails_before_any_group_forms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.distributed as dist

    from antdt.agent import init_process_group
    from antdt.agent.devices import cuda_device_count

    _rank_env(monkeypatch, LOCAL_WORLD_SIZE=str(cuda_device_count() + 1))
    monkeypatch.setenv("ANTDT_BACKEND", "nccl")
    with pytest.raises(ValueError, match="needs a CUDA device per rank"):
        init_process_group(timeout_s=10)
    assert not dist.is_initialized()


def test_a_gloo_group_keeps_the_agents_collectives_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch
    import torch.distributed as dist

    from antdt.agent import collective_device, destroy_process_group, init_process_group
    from antdt.agent.collectives import TorchCollectives

    _rank_env(monkeypatch, ANTDT_BACKEND="gloo")
    assert collective_device() == torch.device("cpu")  # no group: a world of one
    init_process_group(timeout_s=30)
    try:
        assert dist.get_backend() == "gloo"
        assert collective_device() == torch.device("cpu")
        collectives = TorchCollectives(1)
        assert collectives.device == torch.device("cpu")
        assert collectives.all_sum([7, 3]) == [7, 3]
        assert collectives.agree_max(2**55) == 2**55
    finally:
        destroy_process_group()
    assert not dist.is_initialized()


def test_waiting_for_the_device_is_free_where_cuda_was_never_used() -> None:
    import torch

    from antdt.agent.devices import wait_for_device

    if torch.cuda.is_initialized():
        pytest.skip("CUDA is in use in this process: the wait would be a real one")
    wait_for_device()
    assert not torch.cuda.is_initialized()  # it did not start CUDA to find out
