"""The DataLoader path's cost per step: the same small model step over the same dataset,
workers and batch, fed by a plain DataLoader (a shuffled BatchSampler) and by the agent
(`batch_sampler()` + `batches()`, real shards service), in paired rounds of one run."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Generator, Iterator
from typing import Any

from antdt.runtime.bus import Bus
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store
from bench.cases import _AloneCollectives, _settings


class _Rows:
    """A map-style dataset of random rows (module level: spawned workers unpickle it)."""

    def __init__(self, size: int) -> None:
        import torch

        self.x = torch.randn(size, 64)
        self.y = torch.randint(0, 10, (size,))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        return self.x[i], self.y[i]


def _model_step() -> Any:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU()
    )
    head = torch.nn.Linear(512, 10)
    params = [*model.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)

    def step(batch: Any) -> None:
        x, y = batch
        torch.nn.functional.cross_entropy(head(model(x)), y).backward()
        opt.step()
        opt.zero_grad()

    return step


def _timed(batches: Iterator[Any], steps: int, train: Any, sync: bool) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        item = next(batches)
        if sync:
            step, batch = item
            train(batch)
            step.sync(None)
        else:
            train(item)
    return (time.perf_counter() - started) / steps


def _forever(loader: Any) -> Generator[Any, None, None]:
    while True:
        yield from loader


def _agent_batches(agent: Any, loader: Any) -> Generator[Any, None, None]:
    for _ in agent.epochs():
        yield from agent.batches(loader)


async def bench_dataloader(
    cluster: EmbeddedCluster, *, batch: int = 64, workers: int = 2, steps: int = 60, rounds: int = 8
) -> dict[str, Any]:
    """Seconds per step of both paths, each the median of its rounds, and the median of
    paired rounds' agent/plain ratios (adjacent rounds see the same machine load)."""
    import torch

    from antdt.agent import Agent, AgentSettings
    from antdt.services.controller.service import ControllerService, ControllerSettings
    from antdt.services.shards.service import ShardsService, ShardsSettings

    torch.set_num_threads(1)
    base = _settings(cluster, "dataloader")
    runtime = ServiceRuntime("bench-dataloader")
    closing: list[Any] = []
    for cls, service_cls in (
        (ShardsSettings, ShardsService),
        (ControllerSettings, ControllerService),
    ):
        settings = cls(**base.model_dump())
        store = await Store(settings.etcd).connect()
        bus = await Bus(settings.nats, name=f"bench-loader-{cls.__name__}").connect()
        await service_cls(settings, bus, store).start(runtime)  # type: ignore[arg-type]
        closing.append(store)
    size = batch * steps * (rounds + 1) * 2
    cfg = AgentSettings(
        nats=base.nats,
        job="bench-dataloader",
        rank=0,
        world_size=1,
        host="h0",
        dataset_size=size,
        shard_size=1024,
        global_batch=batch,
        epochs=4,
        register_timeout_s=15.0,
    )
    agent = Agent(cfg, collectives=_AloneCollectives())
    await asyncio.to_thread(agent.start)
    data: Any = _Rows(size)
    # Spawned, not forked: this process runs the services' gRPC threads, which fork breaks.
    common: dict[str, Any] = {
        "num_workers": workers,
        "prefetch_factor": 2,
        "persistent_workers": True,
        "multiprocessing_context": "spawn",
    }
    plain: Any = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, **common)
    ours: Any = torch.utils.data.DataLoader(data, batch_sampler=agent.batch_sampler(data), **common)
    train = _model_step()
    paths: dict[str, Generator[Any, None, None]] = {
        "plain": _forever(plain),
        "agent": _agent_batches(agent, ours),
    }
    try:
        for name, it in paths.items():  # warm up: workers started, first grants in
            await asyncio.to_thread(_timed, it, steps // 2, train, name == "agent")
        times: dict[str, list[float]] = {"plain": [], "agent": []}
        for r in range(rounds):
            order = ("plain", "agent") if r % 2 == 0 else ("agent", "plain")
            for name in order:
                took = await asyncio.to_thread(_timed, paths[name], steps, train, name == "agent")
                times[name].append(took)
    finally:
        for it in paths.values():  # the loaders' workers shut down now, not at exit
            it.close()
        await asyncio.to_thread(agent.close)
        await runtime.shutdown()
        for store in closing:
            await store.close()
    ratios = [a / p for a, p in zip(times["agent"], times["plain"], strict=True)]
    return {
        "plain_ms": statistics.median(times["plain"]) * 1000,
        "agent_ms": statistics.median(times["agent"]) * 1000,
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "batch": batch,
        "workers": workers,
    }


def dataloader_row(got: dict[str, Any]) -> dict[str, Any]:
    return {
        "what": f"DataLoader step through the agent, ms (batch {got['batch']}, "
        f"{got['workers']} workers, small MLP step)",
        "value": got["agent_ms"],
        "baseline": got["plain_ms"],
        "baseline_what": "plain DataLoader, same dataset, workers, batch and step",
        "ratio": got["ratio"],
        "target": "ratio <= 1.02 (median of paired rounds)",
    }
