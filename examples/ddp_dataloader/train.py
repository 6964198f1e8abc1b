"""A standard DDP + DataLoader training script (torchrun, gloo on CPU)."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

import antdt.agent

SIZE, BATCH, EPOCHS = 2048, 32, 2


class Points(Dataset):
    def __init__(self, size: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 16, generator=g)
        self.y = (self.x.sum(dim=1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def main() -> None:
    dist.init_process_group("gloo")
    agent = antdt.agent.init(dataset_size=SIZE, global_batch=BATCH * dist.get_world_size(), epochs=EPOCHS)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)))
    agent.weighted(model)  # batch-weighted gradients under uneven per-rank batches
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = Points(SIZE)
    loader = DataLoader(data, batch_sampler=agent.batch_sampler(data), num_workers=2)
    for epoch in agent.epochs():
        for step, (x, y) in agent.batches(loader, empty=(torch.empty(0, 16), torch.empty(0).long())):
            loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum") / max(1, len(y))
            loss.backward()
            step.sync(model)
            opt.step()
            opt.zero_grad()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")
    agent.close()
    antdt.agent.destroy_process_group()


if __name__ == "__main__":
    main()
