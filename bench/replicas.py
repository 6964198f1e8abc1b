"""Shards replicas in child processes, as in production (in the bench's own process they
would be billed the clients' Python time), reporting their counters over the measured
window only."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from antdt.runtime import loops
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store
from antdt.schemas import (
    JobSpec,
    Subjects,
)
from bench.secured import Access

#: Numbers the cycles benches' jobs, so that no run takes up an earlier one's ledger.


class Children:
    """Bench processes, each with a pipe: it sends "ready" once serving, answers each
    command sent to it, and returns on "exit". Spawned, not forked: a fork of a process
    holding gRPC (the bench's etcd client) is unsafe."""

    def __init__(self, what: str, targets: list[tuple[Callable[..., None], tuple[Any, ...]]]):
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.what = what
        self._conns: list[Any] = []
        self._processes: list[Any] = []
        for target, args in targets:
            here, there = context.Pipe()
            process = context.Process(target=target, args=(*args, there), daemon=True)
            process.start()
            self._conns.append(here)
            self._processes.append(process)

    async def started(self) -> None:
        for conn in self._conns:
            if not await asyncio.to_thread(conn.poll, 60) or conn.recv() != "ready":
                raise RuntimeError(f"{self.what} did not start")

    async def ask(self, command: Any) -> list[Any]:
        """Send `command` to every child; their answers, in order."""
        for conn in self._conns:
            conn.send(command)
        return [await asyncio.to_thread(conn.recv) for conn in self._conns]

    async def stop(self) -> None:
        for conn, process in zip(self._conns, self._processes, strict=True):
            conn.send("exit")
            await asyncio.to_thread(process.join, 15)
            if process.is_alive():
                process.kill()


def _replica_process(settings_json: str, conn: Any) -> None:
    from antdt.runtime.process import configure_gc
    from antdt.runtime.telemetry.logs import configure_logging
    from antdt.services.shards.service import ShardsSettings

    configure_logging("warning", "console")
    # Through __init__, so ANTDT_* variables fill what the bench leaves unset.
    settings = ShardsSettings(**json.loads(settings_json))
    configure_gc(settings.gc_thresholds)  # as the CLI does for a service process
    loops.run(_serve_replica(settings, conn), settings.event_loop)


async def _serve_replica(settings: Any, conn: Any) -> None:
    """Serve until told "exit"; on any other command send the counters since the last
    "go" (since the start before one), and on "go" start counting again."""
    from antdt.services.runner import start_service

    runtime = ServiceRuntime("bench-shards-replica")
    service = await start_service("shards", settings, runtime)
    conn.send("ready")
    at_go: dict[str, float] = {}
    while (command := await asyncio.to_thread(conn.recv)) != "exit":
        committer = service.committer
        figures = {
            "cpu_s": time.process_time(),
            "commits": committer.commits,
            "committed": committer.committed,
            "cas_conflicts": committer.cas_conflicts,
            "early": committer.early,
            "apply_s": committer.apply_seconds,
            "store_s": committer.store_seconds,
            "written_bytes": committer.written_bytes,
            "budget_waits": committer.budget_waits,
        }
        if command == "go":
            at_go = figures
        conn.send({name: value - at_go.get(name, 0) for name, value in figures.items()})
    await runtime.shutdown()


class ShardsReplicas:
    """`count` shards replicas in child processes, against the bench cluster."""

    def __init__(
        self,
        cluster: EmbeddedCluster,
        *,
        count: int,
        settings: dict[str, Any] | None = None,
        access: Access | None = None,
    ) -> None:
        """`settings`: ShardsSettings fields to set, beyond the connections. `access`:
        other servers, the replicas' user and the clients' there (default: `cluster`)."""
        pids = {"nats": cluster.nats.pid, "etcd": cluster.etcd.pid}
        plain = Access(
            cluster.nats.url, cluster.etcd.endpoint, "bench.shards", "/bench/shards/", pids
        )
        access = access or plain
        self.subjects = Subjects(access.subject_prefix)
        self.key_prefix = access.key_prefix
        self.nats = access.nats("agent-cycles")  # what the clients connect as
        self.count = count
        self.server_pids = access.server_pids
        connections = {"nats": access.nats_fields("shards"), "etcd": access.etcd_fields("shards")}
        each = [
            json.dumps({**connections, **(settings or {}), "replica_id": f"bench-shards-{index}"})
            for index in range(count)
        ]
        self._children = Children("a shards replica", [(_replica_process, (one,)) for one in each])

    async def __aenter__(self) -> ShardsReplicas:
        await self._children.started()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._children.stop()

    async def go(self) -> None:
        await self._children.ask("go")

    async def counters(self) -> dict[str, float]:
        """Since `go` (since they started, before one), summed over the replicas."""
        totals: dict[str, float] = {}
        for figures in await self._children.ask("counters"):
            for name, value in figures.items():
                totals[name] = totals.get(name, 0) + value
        return totals

    async def register(self, store: Store | None, spec: JobSpec) -> None:
        assert store is not None, "shards replicas read the job's spec from etcd"
        await store.put(f"{self.key_prefix}jobs/{spec.job}/spec", spec.model_dump_json().encode())
