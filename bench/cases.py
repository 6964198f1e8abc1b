"""Benchmark cases. Each returns plain figures; __main__ pairs them with baselines."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from antdt.runtime.bus import Bus
from antdt.runtime.config import EtcdSettings, NatsSettings, ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store
from antdt.schemas import (
    StepEvent,
    Subjects,
)


def _settings(cluster: EmbeddedCluster, tag: str) -> ServiceSettings:
    return ServiceSettings(
        nats=NatsSettings(url=cluster.nats.url, subject_prefix=f"bench.{tag}"),
        etcd=EtcdSettings(endpoint=cluster.etcd.endpoint, key_prefix=f"/bench/{tag}/"),
        replica_id=f"bench-{tag}",
    )


def bench_detector_memory(*, ranks: int, windows: int) -> dict[str, float]:
    """Bytes per tracked rank of one JobDetector after `windows` windows of every rank:
    tracemalloc around decoding + ingesting a healthy trace (the trace's bytes are
    allocated before tracing starts, so only what the detector keeps is counted)."""
    import tracemalloc

    from antdt.services.monitor.detector import DetectorConfig, JobDetector
    from antdt.sim.traces import generate, healthy

    window = DetectorConfig().window
    trace = generate(healthy(ranks, windows * window + window // 2, seed=7))
    payloads = [(now, event.model_dump_json().encode()) for now, event in trace.events]
    del trace
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    detector = JobDetector("trace", ranks)
    for now, data in payloads:
        detector.ingest(StepEvent.model_validate_json(data), now)
    detector.health(payloads[-1][0])
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {"bytes_per_rank": (after - before) / ranks, "ranks": ranks, "windows": windows}


class _AloneCollectives:
    """No other ranks: the agent's own cost, without communication."""

    def count(self, local_samples: int) -> int:
        return local_samples

    def reduce_gradients(self, model: Any, local_samples: int) -> int:
        return local_samples

    def agree_max(self, value: int) -> int:
        return value

    def all_sum(
        self, values: list[int], around: frozenset[int] = frozenset(), posts: Any = None
    ) -> list[int]:
        return list(values)

    def reduce_gradients_and_sum(
        self,
        model: Any,
        local_samples: int,
        values: list[int],
        around: frozenset[int] = frozenset(),
    ) -> list[int]:
        return list(values)


def _steps_cost(iterator: Any, steps: int) -> tuple[float, float]:
    """Seconds per step on the training thread (steps() + sync, no collectives): wall
    time, and the thread's own CPU time. Wall time includes waiting for the GIL while
    this process's other threads run: here the services and the other agent, which a
    rank's process does not have; CPU time is what the agent's calls themselves cost."""
    model = object()
    started, cpu = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        next(iterator).sync(model)
    return (time.perf_counter() - started) / steps, (time.thread_time() - cpu) / steps


async def bench_agent_tracing(
    cluster: EmbeddedCluster, *, steps: int = 6000, rounds: int = 24, command_every: int = 300
) -> dict[str, Any]:
    """The agent's cost per step on the training thread, tracing off and on: the thread's
    CPU time per step (see _steps_cost) and its wall time, each mode the median of its
    rounds, and the median of paired rounds' on/off ratios."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from antdt.agent import Agent, AgentSettings
    from antdt.schemas import Ack, AdjustBatch, Plan
    from antdt.services.controller.service import ControllerService, ControllerSettings
    from antdt.services.shards.service import ShardsService, ShardsSettings

    base = _settings(cluster, "tracing")
    runtime = ServiceRuntime("bench-tracing")
    stores = []
    for cls, service_cls in (
        (ShardsSettings, ShardsService),
        (ControllerSettings, ControllerService),
    ):
        settings = cls(**base.model_dump())
        store = await Store(settings.etcd).connect()
        bus = await Bus(settings.nats, name=f"bench-{cls.__name__}").connect()
        await service_cls(settings, bus, store).start(runtime)  # type: ignore[arg-type]
        stores.append(store)
    exporter = InMemorySpanExporter()
    traced = TracerProvider()
    traced.add_span_processor(BatchSpanProcessor(exporter))
    client = await Bus(base.nats, name="bench-commander").connect()
    sender = TracerProvider().get_tracer("bench")  # records nothing; gives the context
    subjects = Subjects(base.nats.subject_prefix)
    agents: dict[str, Any] = {}
    iterators: dict[str, Any] = {}
    for mode, provider in (("off", None), ("on", traced)):
        cfg = AgentSettings(
            nats=base.nats,
            job=f"bench-tracing-{mode}",
            rank=0,
            world_size=1,
            host="h0",
            dataset_size=8 * (rounds + 1) * (steps + 200) * 2,
            shard_size=20_000,
            global_batch=8,
            register_timeout_s=15.0,
        )
        agent = Agent(cfg, collectives=_AloneCollectives(), tracer_provider=provider)
        await asyncio.to_thread(agent.start)
        await asyncio.to_thread(next, agent.epochs())  # blocks until data: not on this loop
        iterators[mode] = agent.steps()
        await asyncio.to_thread(_steps_cost, iterators[mode], 200)  # warm up
        agents[mode] = agent
    versions = {mode: 0 for mode in agents}

    async def commander(mode: str, done: asyncio.Event) -> None:
        agent, next_at = agents[mode], agents[mode].step + command_every
        while not done.is_set():
            if agent.step >= next_at:
                versions[mode] += 1
                plan = Plan(
                    job=agent.settings.job,
                    version=versions[mode],
                    local_batch=(8,),
                    effective_step=agent.step + 3,
                    created_at=time.time(),
                )
                command = AdjustBatch(action_id=f"{mode}-{plan.version}", job=plan.job, plan=plan)
                with sender.start_as_current_span("send adjust_batch"):
                    await client.request(subjects.command(plan.job, 0), command, Ack)
                next_at += command_every
            await asyncio.sleep(0.002)

    costs: dict[str, list[float]] = {mode: [] for mode in agents}
    walls: dict[str, list[float]] = {mode: [] for mode in agents}
    for i in range(rounds):
        for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
            done = asyncio.Event()
            task = asyncio.create_task(commander(mode, done))
            wall, cpu = await asyncio.to_thread(_steps_cost, iterators[mode], steps)
            walls[mode].append(wall)
            costs[mode].append(cpu)
            done.set()
            await task
    for agent in agents.values():
        await asyncio.to_thread(agent.close)  # flushes the traced one's provider
    await client.close()
    await runtime.shutdown()
    for store in stores:
        await store.close()
    spans = exporter.get_finished_spans()
    off, on = statistics.median(costs["off"]), statistics.median(costs["on"])
    ratios = [a / b for a, b in zip(costs["on"], costs["off"], strict=True)]
    wall_ratios = [a / b for a, b in zip(walls["on"], walls["off"], strict=True)]
    return {
        "off_us": off * 1e6,
        "on_us": on * 1e6,
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "off_wall_us": statistics.median(walls["off"]) * 1e6,
        "on_wall_us": statistics.median(walls["on"]) * 1e6,
        "wall_ratio": statistics.median(wall_ratios),
        "commands": versions["on"],
        "applied_spans": sum(1 for s in spans if s.name == "apply plan"),
        "process_spans": sum(1 for s in spans if s.name.startswith("process ")),
    }
