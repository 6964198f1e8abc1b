"""The demo's training script: a real data-parallel job (gloo on CPU) that imports only
`antdt.agent`. Run by `antdt launch --nproc 4 -- python -m antdt.demo.train`.

Settings come from the environment like any AntDT job (ANTDT_JOB, ANTDT_POLICY, ...);
ANTDT_DEMO_OUT names the folder where rank 0 writes per-step progress and the result."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import antdt.agent as antdt_agent
from antdt.demo.data import augmented_train_set, test_set

WIDTH = int(os.environ.get("ANTDT_DEMO_WIDTH", "1024"))


def build_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)  # same initial weights on every rank
    return torch.nn.Sequential(
        torch.nn.Linear(64, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, 10),
    )


BASE_LR = 2e-3


def learning_rate(seen: int, total: int, step_samples: int, settings: Any) -> float:
    """Cosine decay over samples seen (not steps), scaled by the share of the global batch
    this step carried: epoch tails under uneven batches end with a few small steps, and a
    50-sample step must not move the weights as far as a full one. Decaying to zero also
    makes the final model far less sensitive to sample order (which dynamic sharding
    changes from run to run)."""
    progress = min(1.0, seen / total)
    share = step_samples / settings.global_batch
    return BASE_LR * 0.5 * (1.0 + math.cos(math.pi * progress)) * share


def accuracy(model: torch.nn.Module) -> float:
    x, y = test_set()
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


def main() -> None:
    torch.set_num_threads(1)  # ranks share the machine's cores
    antdt_agent.init_process_group()
    agent = antdt_agent.init()
    settings = agent.settings
    x_train, y_train = augmented_train_set(settings.dataset_size, settings.seed)
    model = build_model(settings.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=BASE_LR)
    total_samples = settings.epochs * settings.dataset_size
    seen = 0
    out = Path(os.environ.get("ANTDT_DEMO_OUT", "."))
    progress = open(out / "progress.jsonl", "w") if settings.rank == 0 else None  # noqa: SIM115
    for epoch in agent.epochs():
        for step in agent.steps():
            ids = step.sample_ids
            if ids:
                index = torch.tensor(ids)
                loss = F.cross_entropy(model(x_train[index]), y_train[index])
                loss.backward()
            step.sync(model)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(seen, total_samples, step.total_samples, settings)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            seen += step.total_samples
            if progress is not None:
                record = {
                    "step": step.index,
                    "epoch": epoch,
                    "t": time.time(),
                    "samples": step.total_samples,
                    "local_batch": step.local_batch,
                    "plan_version": step.plan_version,
                }
                progress.write(json.dumps(record) + "\n")
                progress.flush()
    agent.close()
    if progress is not None:
        progress.close()
        result = {"accuracy": accuracy(model), "dropped_events": agent.dropped_events}
        (out / "result.json").write_text(json.dumps(result))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
