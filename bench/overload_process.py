"""A service replica in a process of its own for the overload bench (overload.py), and
the pacing both halves share. The process (`python -m bench.overload_process SERVICE
CONFIG`) answers `status` on its stdin with one JSON line marked ANSWER: RSS now (VmRSS),
its peak (VmHWM), and its metrics (an in-memory OpenTelemetry reader), by `reason`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.runtime.cpubudget import CpuBudget, detect
from antdt.runtime.store import Store
from antdt.schemas import JobSpec, Keys
from bench.children import start_module

ANSWER = "@overload "


class ServiceProcess:
    """One service replica in its own process, asked for its RSS and metrics."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.peak_rss = 0  # the largest VmRSS any `status` saw
        self._asking = asyncio.Lock()  # one question at a time on the pipe

    @classmethod
    async def start(cls, service: str, config: dict[str, Any]) -> ServiceProcess:
        process = await start_module(
            "overload_process",
            service,
            json.dumps(config),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    async def status(self) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        async with self._asking:
            self.process.stdin.write(b"status\n")
            await self.process.stdin.drain()
            while True:
                line = (await self.process.stdout.readline()).decode()
                if not line:
                    code = self.process.returncode
                    raise RuntimeError(f"bench: the service process exited ({code})")
                if line.startswith(ANSWER):
                    found: dict[str, Any] = json.loads(line[len(ANSWER) :])
                    self.peak_rss = max(self.peak_rss, found["rss"])
                    return found

    async def metric(self, name: str, reason: str | None = None) -> float:
        points = (await self.status())["metrics"].get(name, {})
        return float(sum(v for r, v in points.items() if reason is None or r == reason))

    async def sample(self, stop: asyncio.Event, every_s: float = 0.1) -> None:
        """Run as a task until `stop`: keep `peak_rss` up to date."""
        while not stop.is_set() and self.alive:
            await self.status()
            await asyncio.sleep(every_s)

    async def stop(self) -> None:
        if self.alive:
            self.process.terminate()
            await self.process.wait()


@dataclass
class Replica:
    """A replica under load and the bench's own connections to the bus."""

    service: ServiceProcess
    buses: tuple[Bus, ...]
    lived: bool = False  # whether the replica was alive when the run ended


@contextlib.asynccontextmanager
async def replica(
    kind: str,
    settings: ServiceSettings,
    spec: JobSpec,
    *,
    config: dict[str, Any] | None = None,
    buses: tuple[str, ...] = (),
    cpus: float | None = None,
) -> AsyncIterator[Replica]:
    """The job's spec in etcd, a `kind` replica in a process of its own (`config`: its
    settings, `settings` by default; in a CPU budget of `cpus` where given) and one bus
    connection per name in `buses`: all taken down however the block ends, in reverse,
    the replica's liveness recorded first."""
    store = await Store(settings.etcd).connect()
    try:
        await store.put(
            Keys(settings.etcd.key_prefix).spec(spec.job), spec.model_dump_json().encode()
        )
    finally:
        await store.close()
    async with contextlib.AsyncExitStack() as stack:
        service = await ServiceProcess.start(kind, config or settings.model_dump())
        stack.push_async_callback(service.stop)
        if cpus is not None:
            budget = CpuBudget(f"antdt-ov{kind[0]}-{os.getpid()}", cpus, *detect()).create()
            stack.callback(budget.remove)
            budget.add(service.process.pid)
        connected = []
        for name in buses:
            bus = await Bus(settings.nats, name=name).connect()
            stack.push_async_callback(bus.close)
            connected.append(bus)
        run = Replica(service, tuple(connected))
        try:
            yield run
        finally:
            run.lived = service.alive


class RawPublisher:
    """NATS's text protocol on a bare socket (plaintext, no auth: the bench's servers):
    messages framed beforehand go out a tick's worth per write, a rate no nats-py client
    reaches with one await per message, which 10x a replica's rate needs."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    @classmethod
    async def connect(cls, url: str) -> RawPublisher:
        host, port = url.split("://")[-1].split(",")[0].rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        await reader.readline()  # INFO
        writer.write(b'CONNECT {"verbose":false,"pedantic":false}\r\n')
        return cls(reader, writer)

    @staticmethod
    def frame(subject: str, reply: str, data: bytes) -> bytes:
        """One message as the protocol sends it (reply: "" for none)."""
        return b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(), len(data), data)

    async def send(self, frames: bytes) -> None:
        self._writer.write(frames)
        await self._writer.drain()

    async def close(self) -> None:
        self._writer.write(b"PING\r\n")  # answered once the server read everything
        await self._writer.drain()
        with contextlib.suppress(Exception):
            while not (await asyncio.wait_for(self._reader.readline(), 30)).startswith(b"PONG"):
                pass
        self._writer.close()


async def paced(
    frames: list[bytes], publisher: RawPublisher, rate: float, seconds: float
) -> tuple[int, float]:
    """Publish `rate` messages a second for `seconds`, going round `frames` (made by
    RawPublisher.frame), each 10 ms tick's in one write, behind where it cannot keep up;
    returns (messages, seconds taken)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    sent, size = 0, len(frames)
    while (now := loop.time()) - start < seconds:
        due = int((now - start) * rate)
        await publisher.send(b"".join([frames[n % size] for n in range(sent, due)]))
        sent = due
        await asyncio.sleep(0.01)
    return sent, loop.time() - start


async def settled(
    count: Callable[[], Awaitable[float]], idle_s: float = 1.0, limit_s: float = 120
) -> float:
    """The count once it stopped changing for `idle_s`."""
    last, since, deadline = await count(), time.monotonic(), time.monotonic() + limit_s
    while time.monotonic() - since < idle_s and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        if (now := await count()) != last:
            last, since = now, time.monotonic()
    return float(last)


# -- the service process -------------------------------------------------------------------


def _proc_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _points(reader: Any) -> dict[str, dict[str, float]]:
    """Every counter's points, summed by their `reason` attribute ("": none)."""
    found: dict[str, Counter[str]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in getattr(metric.data, "data_points", ()):
                    reason = str((point.attributes or {}).get("reason", ""))
                    value = getattr(point, "value", None)
                    if value is not None:
                        found.setdefault(metric.name, Counter())[reason] += value
    return {name: dict(c) for name, c in found.items()}


async def _serve(service: str, config: dict[str, Any]) -> None:
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from antdt.runtime.lifecycle import ServiceRuntime
    from antdt.services.runner import settings_class, start_service

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    settings = settings_class(service)(**config)
    runtime = ServiceRuntime(settings.replica_id)
    await start_service(service, settings, runtime)
    while line := (await asyncio.to_thread(sys.stdin.readline)).strip():
        answer = {"rss": _proc_kb("VmRSS"), "hwm": _proc_kb("VmHWM"), "metrics": _points(reader)}
        print(ANSWER + json.dumps(answer if line == "status" else {}), flush=True)
    await runtime.shutdown()


if __name__ == "__main__":
    from antdt.runtime import loops

    loops.run(_serve(sys.argv[1], json.loads(sys.argv[2])), "auto")
