"""Monitor replicas share the ingest: two jobs' step events ingested by one replica, then
by two (processes of their own, the jobs spread by placement). A replica process
(`python -m bench.ingest_replicas CONFIG`) answers each command on its stdin with one
JSON line marked ANSWER (its logs share its stdout): `count`, `go` (count from here; the
jobs it owns), `result`."""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from typing import Any

from antdt.runtime import loops
from antdt.runtime.bus import Bus
from antdt.runtime.config import EtcdSettings, NatsSettings
from antdt.runtime.coordination.placement import preferred
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store
from antdt.schemas import JobSpec, Keys, RankHello, Subjects
from bench.cases import _settings
from bench.children import start_module
from bench.ingest import RANKS, _load, _until_settled
from bench.publisher import step_event

REPLICAS = ("bench-m0", "bench-m1")
#: Marks the replica process's answers on its stdout, which its logs share.
ANSWER = "@bench "


def _jobs(tag: str) -> list[str]:
    """Two job ids, one preferred by each replica when both run."""
    found: dict[str, str] = {}
    n = 0
    while len(found) < len(REPLICAS):
        job = f"{tag}j{n}"
        owner = preferred(job, REPLICAS)
        if owner is not None and owner not in found:
            found[owner] = job
        n += 1
    return [found[replica] for replica in REPLICAS]


async def bench_ingest_replicas(cluster: EmbeddedCluster, *, events: int) -> dict[str, Any]:
    """`events` step events per job (two jobs of 64 ranks), ingested by one replica and
    then by two: the events per second all replicas together ingested, and each one's
    share."""
    one = await _run(cluster, events, REPLICAS[:1])
    two = await _run(cluster, events, REPLICAS)
    return {"one": one, "two": two, "ratio": two["events_per_s"] / one["events_per_s"]}


async def _run(cluster: EmbeddedCluster, events: int, replicas: tuple[str, ...]) -> dict[str, Any]:
    base = _settings(cluster, f"share{time.monotonic_ns() % 10**9}")
    subjects, keys = Subjects(base.nats.subject_prefix), Keys(base.etcd.key_prefix)
    jobs = _jobs(base.replica_id)
    store = await Store(base.etcd).connect()
    bus = await Bus(base.nats, name="bench-share").connect()
    children = [await _Replica.start(base.nats, base.etcd, name) for name in replicas]
    try:
        for child in children:  # each knows every replica: placement agrees everywhere

            async def knows_all(child: _Replica = child) -> bool:
                return await child.members() == len(replicas)

            await _wait(knows_all, "every replica knows the others")
        await _claimed(bus, store, keys, subjects, jobs)
        await _warm_up(bus, subjects, jobs, children)
        owned = [await child.go() for child in children]
        loads = [await _load(base.nats.model_dump(mode="json"), job, events) for job in jobs]
        results = [await child.result() for child in children]
        for load in loads:
            await load.wait()
    finally:
        for child in children:
            await child.stop()
        await bus.close()
        await store.close()
    ingested = sum(r["ingested"] for r in results)
    span = max(r["last"] for r in results) - min(r["first"] for r in results)
    expected = events // RANKS * RANKS * len(jobs)
    return {
        "events_per_s": ingested / span,
        "lost": expected - ingested,
        "per_replica": [r["ingested"] for r in results],
        "jobs_per_replica": [len(jobs_owned) for jobs_owned in owned],
    }


async def _claimed(bus: Bus, store: Store, keys: Keys, subjects: Subjects, jobs: list[str]) -> None:
    """Each job registered and started (a hello: how a job starting is claimed), until
    every job has an owner."""
    for job in jobs:
        spec = JobSpec(
            job=job, world_size=RANKS, dataset_size=10**6, shard_size=1000, global_batch=32 * RANKS
        )
        await store.put(keys.spec(job), spec.model_dump_json().encode())
        hello = RankHello(
            job=job, rank=0, world_size=RANKS, host="h0", pid=1, started_at=time.time()
        )
        await bus.publish(subjects.hello(job, 0), hello)
    await _wait(lambda: _count(store, keys.owners("monitor"), len(jobs)), "every job owned")


async def _warm_up(bus: Bus, subjects: Subjects, jobs: list[str], children: list[_Replica]) -> None:
    """Step 0 of every rank (each job's detector made), and wait until all are counted."""
    for job in jobs:
        for rank in range(RANKS):
            await bus.publish(subjects.step(job, rank), step_event(rank, 0, job))
    await bus.flush()

    async def counted() -> bool:
        return sum([await child.count() for child in children]) >= RANKS * len(jobs)

    await _wait(counted, "warm-up steps ingested")


async def _count(store: Store, prefix: str, n: int) -> bool:
    return len(await store.get_prefix(prefix, keys_only=True)) >= n


async def _wait(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench: timed out waiting for {what}")
        await asyncio.sleep(0.05)


class _Replica:
    """A monitor replica process, driven over its stdin and stdout."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, nats: NatsSettings, etcd: EtcdSettings, name: str) -> _Replica:
        config = {"nats": nats.model_dump(), "etcd": etcd.model_dump(), "replica_id": name}
        process = await start_module(
            "ingest_replicas",
            json.dumps(config),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def _ask(self, command: str) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{command}\n".encode())
        await self.process.stdin.drain()
        while True:
            line = (await self.process.stdout.readline()).decode()
            if not line:
                raise RuntimeError(f"bench: a monitor replica exited ({self.process.returncode})")
            if line.startswith(ANSWER):
                return json.loads(line[len(ANSWER) :])

    async def count(self) -> int:
        return int(await self._ask("count"))

    async def members(self) -> int:
        return int(await self._ask("members"))

    async def go(self) -> list[str]:
        return list(await self._ask("go"))

    async def result(self) -> dict[str, float]:
        return dict(await self._ask("result"))

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            await self.process.wait()


async def _serve(config: dict[str, Any]) -> None:
    """The replica process: a MonitorService, and the bench's commands on stdin."""
    from antdt.runtime.lifecycle import ServiceRuntime
    from antdt.services.monitor.service import MonitorSettings
    from antdt.services.runner import start_service

    settings = MonitorSettings(**config)
    runtime = ServiceRuntime(settings.replica_id)
    monitor = await start_service("monitor", settings, runtime)
    measuring: asyncio.Task[dict[str, float]] | None = None
    while line := (await asyncio.to_thread(sys.stdin.readline)).strip():
        answer: Any
        if line == "count":
            answer = monitor.ingested
        elif line == "members":
            answer = len(monitor.intake.replicas)
        elif line == "go":  # from here on, before the load starts
            answer = monitor.ownership.jobs
            measuring = asyncio.create_task(_measure(monitor, monitor.ingested, bool(answer)))
        elif line == "result" and measuring is not None:
            answer = await measuring
        else:
            answer = {"error": f"unexpected command {line!r}"}
        print(ANSWER + json.dumps(answer), flush=True)
    await runtime.shutdown()


async def _measure(monitor: Any, since: int, owns_jobs: bool) -> dict[str, float]:
    """One replica's events: when its first and last came (perf_counter, one clock for
    every process of the machine) and how many, settled when they stop coming."""

    def count() -> int:
        return int(monitor.ingested) - since

    deadline = time.perf_counter() + 60
    while count() == 0:
        if not owns_jobs or time.perf_counter() > deadline:
            return {"ingested": 0, "first": math.inf, "last": -math.inf}
        await asyncio.sleep(0.001)
    first = time.perf_counter()
    elapsed = await _until_settled(count, 2**62, first, idle_s=1.0)
    return {"ingested": count(), "first": first, "last": first + elapsed}


if __name__ == "__main__":
    loops.run(_serve(json.loads(sys.argv[1])), "auto")
