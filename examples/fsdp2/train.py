"""FSDP2 (`fully_shard`) training under AntDT: the agent chooses each rank's samples every
step, and `agent.weighted(model)` makes FSDP2's reduce-scatter weigh every rank by its
batch, so each step's gradient is the mean over all the step's samples (README.md).

    torchrun --nproc-per-node=2 examples/fsdp2/train.py [--out params.pt]
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import TensorDataset

import antdt.agent


def make_dataset(size: int, dtype: torch.dtype) -> TensorDataset:
    """A map-style dataset: noisy y = sin(x @ w), the same on every rank."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(size, 16, generator=gen, dtype=dtype)
    w = torch.randn(16, 4, generator=gen, dtype=dtype)
    noise = 0.01 * torch.randn(size, 4, generator=gen, dtype=dtype)
    return TensorDataset(x, torch.sin(x @ w) + noise)


def make_model(device: torch.device, dtype: torch.dtype) -> torch.nn.Sequential:
    torch.manual_seed(0)  # every rank starts from the same parameters
    layers = [torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4)]
    return torch.nn.Sequential(*layers).to(device=device, dtype=dtype)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", help="write the trained parameters here (rank 0)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)

    agent = antdt.agent.init()  # settings from ANTDT_* (job, servers, dataset size, ...)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device, backend = torch.device("cuda", torch.cuda.current_device()), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    antdt.agent.init_process_group(backend)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))

    dataset = make_dataset(agent.spec.dataset_size, dtype)
    model = make_model(device, dtype)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    agent.weighted(model)  # the AntDT change to FSDP2: batch-weighted reduce-scatter
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    for epoch in agent.epochs():
        steps, loss_sum = 0, torch.zeros((), device=device, dtype=dtype)
        for step in agent.steps():  # this rank's sample ids, under the step's plan
            n, steps = len(step.sample_ids), steps + 1
            for chunk in antdt.agent.accumulate(model, step.micro_batches):
                x, y = (t.to(device) for t in dataset[chunk])
                # Summed over the chunk, divided by the rank's batch: 0 for an empty chunk.
                loss = torch.nn.functional.mse_loss(model(x), y, reduction="sum") / max(n, 1)
                loss.backward()
                loss_sum += loss.detach()  # no host sync per step
            step.sync(model)  # times the step and records its ids; no second reduction
            opt.step()
            opt.zero_grad()
        mean = float(loss_sum) / max(steps, 1)
        print(f"rank {agent.settings.rank} epoch {epoch}: {steps} steps, loss {mean:.4f}")

    full = {name: p.full_tensor().detach().cpu() for name, p in model.named_parameters()}
    if args.out and agent.settings.rank == 0:
        torch.save(full, args.out)
    agent.close()
    antdt.agent.destroy_process_group()


if __name__ == "__main__":
    main()
