"""A DDP + DataLoader job whose dataset does real extra work per sample on one rank from
a given sample on (ANTDT_TEST_SLOW_DATA="rank=1,after=2560,loops=20000"): that rank is
data-bound, its own CPU busy in `__getitem__` (no sleep)."""

from __future__ import annotations

import os

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

import antdt.agent


class Points(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, size: int, loops: int, after: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 16, generator=g)
        self.y = (self.x.sum(dim=1) > 0).long()
        self.loops, self.after, self.fetched = loops, after, 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.fetched += 1
        if self.loops and self.fetched > self.after:
            total = 0
            for k in range(self.loops):  # decoding, augmenting: the CPU's own work
                total += k * k
        return self.x[i], self.y[i]


def main() -> None:
    torch.set_num_threads(1)
    antdt.agent.init_process_group()
    agent = antdt.agent.init()
    spec = dict(
        kv.split("=", 1) for kv in os.environ.get("ANTDT_TEST_SLOW_DATA", "").split(",") if kv
    )
    slow = int(spec.get("rank", -1)) == agent.settings.rank
    data = Points(
        agent.settings.dataset_size,
        int(spec.get("loops", 0)) if slow else 0,
        int(spec.get("after", 0)),
    )
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    model = DDP(layers)
    agent.weighted(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(data, batch_sampler=agent.batch_sampler(data), num_workers=0)
    empty = (torch.empty(0, 16), torch.empty(0, dtype=torch.long))
    for _ in agent.epochs():
        for step, (x, y) in agent.batches(loader, empty=empty):
            loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum") / max(1, len(y))
            loss.backward()
            step.sync(model)
            opt.step()
            opt.zero_grad()
    agent.close()
    antdt.agent.destroy_process_group()


if __name__ == "__main__":
    main()
