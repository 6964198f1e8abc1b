"""The DataLoader path's cost per step: the same small model step over the same dataset,
workers and batch, fed by a plain DataLoader (a shuffled BatchSampler) and by the agent
(`batch_sampler()` + `batches()`, real shards service), in paired rounds of one run.

The shards and controller services run in their own process (`python -m
bench.dataloader NATS ETCD PREFIX`), as in a deployment: the training process holds only
the agent, so its cost is what the comparison measures, not the services' share of the GIL."""

from __future__ import annotations

import asyncio
import signal
import statistics
import sys
import time
from collections.abc import Generator, Iterator
from typing import Any

from antdt.runtime.servers import EmbeddedCluster
from bench.cases import _AloneCollectives, _settings
from bench.children import start_module

_READY = b"dataloader services ready"


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


def _model_step(width: int) -> Any:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
    )
    head = torch.nn.Linear(width, 10)
    params = [*model.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)

    def step(batch: Any) -> None:
        x, y = batch
        torch.nn.functional.cross_entropy(head(model(x)), y).backward()
        opt.step()
        opt.zero_grad()

    return step


def _timed(batches: Iterator[Any], steps: int, train: Any, sync: bool) -> tuple[float, float]:
    """Wall seconds per step, and the training thread's own CPU seconds per step."""
    started, cpu = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        item = next(batches)
        if sync:
            step, batch = item
            train(batch)
            step.sync(None)
        else:
            train(item)
    return (time.perf_counter() - started) / steps, (time.thread_time() - cpu) / steps


def _forever(loader: Any) -> Generator[Any, None, None]:
    while True:
        yield from loader


def _agent_batches(agent: Any, loader: Any) -> Generator[Any, None, None]:
    for _ in agent.epochs():
        yield from agent.batches(loader)


async def bench_dataloader(
    cluster: EmbeddedCluster,
    *,
    width: int = 1024,
    batch: int = 64,
    workers: int = 2,
    steps: int = 60,
    rounds: int = 8,
) -> dict[str, Any]:
    """Seconds per step of both paths, each the median of its rounds, and the median of
    paired rounds' agent/plain ratios (adjacent rounds see the same machine load)."""
    import torch

    from antdt.agent import Agent, AgentSettings

    torch.set_num_threads(1)
    base = _settings(cluster, "dataloader")
    services = await _start_services(base.nats.subject_prefix, base.etcd.key_prefix, cluster)
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
    train = _model_step(width)
    paths: dict[str, Generator[Any, None, None]] = {
        "plain": _forever(plain),
        "agent": _agent_batches(agent, ours),
    }
    try:
        for name, it in paths.items():  # warm up: workers started, first grants in
            await asyncio.to_thread(_timed, it, steps // 2, train, name == "agent")
        times: dict[str, list[float]] = {"plain": [], "agent": []}
        cpu: dict[str, list[float]] = {"plain": [], "agent": []}
        for r in range(rounds):
            order = ("plain", "agent") if r % 2 == 0 else ("agent", "plain")
            for name in order:
                took, used = await asyncio.to_thread(
                    _timed, paths[name], steps, train, name == "agent"
                )
                times[name].append(took)
                cpu[name].append(used)
    finally:
        for it in paths.values():  # the loaders' workers shut down now, not at exit
            it.close()
        await asyncio.to_thread(agent.close)
        await _stop_services(services)
    ratios = [a / p for a, p in zip(times["agent"], times["plain"], strict=True)]
    return {
        "plain_ms": statistics.median(times["plain"]) * 1000,
        "agent_ms": statistics.median(times["agent"]) * 1000,
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "plain_cpu_ms": statistics.median(cpu["plain"]) * 1000,
        "agent_cpu_ms": statistics.median(cpu["agent"]) * 1000,
        "batch": batch,
        "width": width,
        "workers": workers,
    }


def dataloader_row(got: dict[str, Any], *, target: bool = True) -> dict[str, Any]:
    """The row; without `target`, the ratio is shown with no target (a data-bound step)."""
    return {
        "what": f"DataLoader step through the agent, ms (batch {got['batch']}, "
        f"{got['workers']} workers, MLP of width {got['width']})",
        "value": got["agent_ms"],
        "baseline": got["plain_ms"],
        "baseline_what": "plain DataLoader, same dataset, workers, batch and step",
        "ratio": got["ratio"],
        "target": "ratio <= 1.02 (median of paired rounds)"
        if target
        else "none: the 2 workers bound the step on 2 cores; shown for the cost",
    }


async def _start_services(prefix: str, key_prefix: str, cluster: EmbeddedCluster) -> Any:
    proc = await start_module(
        "dataloader",
        cluster.nats.url,
        cluster.etcd.endpoint,
        prefix,
        key_prefix,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    seen: list[bytes] = []
    try:
        async with asyncio.timeout(60):
            while _READY not in (line := await proc.stdout.readline()):
                if not line:
                    raise RuntimeError(f"the bench's services exited: {b''.join(seen)!r}")
                seen.append(line)
    except BaseException:
        proc.kill()
        raise
    return proc, asyncio.create_task(_discard(proc.stdout))  # its logs must not fill the pipe


async def _discard(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


async def _stop_services(services: Any) -> None:
    proc, drain = services
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    await drain


async def _serve(nats_url: str, etcd_endpoint: str, prefix: str, key_prefix: str) -> None:
    """The shards and controller services until SIGTERM (the monitor is left out: on this
    machine its work would run only in the agent's rounds, beside the training)."""
    from antdt.runtime.config import EtcdSettings, NatsSettings
    from antdt.services.runner import run_services, settings_class

    def settings_for(name: str) -> Any:
        return settings_class(name)(
            nats=NatsSettings(url=nats_url, subject_prefix=prefix),
            etcd=EtcdSettings(endpoint=etcd_endpoint, key_prefix=key_prefix),
            replica_id="bench-dataloader",
        )

    async def ready(_: list[Any]) -> None:
        sys.stdout.buffer.write(_READY + b"\n")
        sys.stdout.flush()

    await run_services(["shards", "controller"], settings_for, ready=ready)


if __name__ == "__main__":
    asyncio.run(_serve(*sys.argv[1:5]))
