"""Shards benchmarks: fetch+done cycles against shards replicas in their own processes,
the stored ledger's size, and the raw etcd and NATS baselines that bound them.

A shards replica is its own process in production, and so are the ranks. Running the
replica in the bench process would bill the clients' Python time to the service (one
event loop, one core), so each replica runs in a child process and reports its counters
(commits, requests per commit, CPU) over the measured window only."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from antdt.agent.route import ShardRoute
from antdt.agent.stream_state import MAX_DONE, Unconfirmed
from antdt.runtime import loops
from antdt.runtime.bus import Bus, RequestRefused
from antdt.runtime.config import EtcdSettings, NatsSettings, ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Put, Store
from antdt.schemas import (
    ErrorCode,
    FetchStatus,
    JobSpec,
    Keys,
    ShardFetch,
    ShardGrant,
    ShardRef,
    ShardReply,
    Subjects,
)

#: Numbers the cycles benches' jobs, so that no run takes up an earlier one's ledger.
_CYCLE_JOBS = itertools.count()


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


async def bench_raw_etcd_txn(endpoint: str, *, seconds: float) -> dict[str, float]:
    """Baseline: serial single-key etcd transactions from one client (fsync on, as the
    ledger's). Its latency bounds a one-client shards cycle from below."""
    store = await Store(EtcdSettings(endpoint=endpoint)).connect()
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        sent = time.perf_counter()
        await store.txn([], [Put("/bench/raw", b"x" * 200)])
        latencies.append(time.perf_counter() - sent)
    elapsed = time.perf_counter() - started
    await store.close()
    return {"txn_per_s": len(latencies) / elapsed, **percentiles(latencies)}


async def bench_raw_nats_request(
    url: str, *, seconds: float, clients: int = 1, event_loop: loops.LoopKind = "auto",
    nats_pid: int | None = None,
) -> dict[str, float]:  # fmt: skip
    """Baseline: request/reply alone, bytes over the Bus's request path (the one the
    shards clients use, without pydantic). A responder in its own process answers at
    once; `clients` connections in this process each loop request -> reply, payloads the
    size of a shard fetch and its reply. Laid out like the shards bench (replica process,
    clients here), it is the ceiling a shards cycle over NATS can reach on this machine:
    one client's latency floor with the etcd baseline; with many, the transport's CPU,
    reported per request for the clients, the responder and nats-server (`nats_pid`)."""
    responder = Children("the raw NATS responder", [(_raw_responder, (url, event_loop))])
    try:
        await responder.started()
        settings = NatsSettings(url=url)
        buses = [await Bus(settings, name=f"raw-{i}").connect() for i in range(clients)]
        latencies: list[float] = []

        async def one_client(bus: Bus, until: float, measuring: bool) -> None:
            while time.perf_counter() < until:
                sent = time.perf_counter()
                await bus.request_raw("raw.request", b"q" * 150, timeout=2)
                if measuring:
                    latencies.append(time.perf_counter() - sent)

        warm_until = time.perf_counter() + 0.3
        await asyncio.gather(*(one_client(b, warm_until, False) for b in buses))
        [responder_cpu] = await responder.ask("cpu")
        cpu, nats_cpu = time.process_time(), _cpu_seconds(nats_pid)
        started = time.perf_counter()
        await asyncio.gather(*(one_client(b, started + seconds, True) for b in buses))
        elapsed = time.perf_counter() - started
        cpu, nats_cpu = time.process_time() - cpu, _cpu_seconds(nats_pid) - nats_cpu
        [responder_after] = await responder.ask("cpu")
        for bus in buses:
            await bus.close()
    finally:
        await responder.stop()
    count = len(latencies)
    return {
        "req_per_s": count / elapsed,
        **percentiles(latencies),
        "responder_cpu_us_per_cycle": (responder_after - responder_cpu) / count * 1e6,
        "client_cpu_us_per_cycle": cpu / count * 1e6,
        "nats_cpu_us_per_cycle": nats_cpu / count * 1e6,
    }


def _raw_responder(url: str, event_loop: loops.LoopKind, conn: Any) -> None:
    from antdt.runtime.telemetry.logs import configure_logging

    configure_logging("warning", "console")
    loops.run(_serve_raw(url, conn), event_loop)


async def _serve_raw(url: str, conn: Any) -> None:
    """Answer every request at once; on each command but "exit", send its CPU seconds."""
    bus = await Bus(NatsSettings(url=url), name="raw-responder").connect()
    answer = b"r" * 400

    async def respond(msg: Any) -> None:
        await msg.respond(answer)

    await bus.nc.subscribe("raw.request", cb=respond)
    await bus.flush()
    conn.send("ready")
    while await asyncio.to_thread(conn.recv) != "exit":
        conn.send(time.process_time())
    await bus.close()


def cpu_per_cycle(figures: dict[str, float]) -> float:
    """CPU microseconds one cycle (or request) cost, all processes together."""
    return sum(v for k, v in figures.items() if k.endswith("_cpu_us_per_cycle"))


def percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[int(0.99 * (len(ordered) - 1))] * 1000,
    }


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
        self, cluster: EmbeddedCluster, *, count: int, settings: dict[str, Any] | None = None
    ) -> None:
        """`settings`: ShardsSettings fields to set, beyond the connections."""
        base = ServiceSettings(
            nats=NatsSettings(url=cluster.nats.url, subject_prefix="bench.shards"),
            etcd=EtcdSettings(endpoint=cluster.etcd.endpoint, key_prefix="/bench/shards/"),
        )
        self.subjects = Subjects(base.nats.subject_prefix)
        self.key_prefix = base.etcd.key_prefix
        self.nats = base.nats
        self.count = count
        self.server_pids = {"nats": cluster.nats.pid, "etcd": cluster.etcd.pid}
        each = [
            json.dumps({**base.model_dump(mode="json"), **(settings or {}),
                        "replica_id": f"bench-shards-{index}"})
            for index in range(count)
        ]  # fmt: skip
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


class CycleServer(Protocol):
    """What answers the cycles: shards replicas, or the in-memory master (master.py)."""

    count: int
    nats: NatsSettings
    subjects: Subjects
    server_pids: dict[str, int | None]

    async def register(self, store: Store | None, spec: JobSpec) -> None: ...
    async def go(self) -> None: ...
    async def counters(self) -> dict[str, float]: ...


async def bench_shards_cycles(
    replicas: CycleServer, store: Store | None, *, clients: int, seconds: float,
    split: bool = False,
) -> dict[str, float]:  # fmt: skip
    """Each client (its own NATS connection, like a rank) loops: report the shard it
    holds as done and fetch the next, in one request; every ledger change durable in
    etcd before the reply. Counters and CPU are taken over the measured window only.
    Each call is a job of its own: one that took up an earlier run's ledger would run
    out of shards once the machine is fast enough (10^5 shards, 5,400/s at 8 clients).

    `split`: a cycle in two requests, as DLRover's ShardingClient makes it (its
    report_task_result, then get_task: two RPCs per shard); only the in-memory master
    is driven so, to measure DLRover's design."""
    job = f"cycles{clients}x{replicas.count}r{next(_CYCLE_JOBS)}{'s' if split else ''}"
    spec = JobSpec(job=job, world_size=clients, dataset_size=10**9, shard_size=10**4,
                   global_batch=clients * 32, epochs=1)  # fmt: skip
    await replicas.register(store, spec)
    buses = [await Bus(replicas.nats, name=f"bench-rank-{r}").connect() for r in range(clients)]
    routes = [ShardRoute(replicas.subjects, job) for _ in range(clients)]
    latencies: list[float] = []
    measuring = False
    busy = 0

    async def one_client(rank: int, until: float) -> None:
        nonlocal busy
        # As the agent does: report the shard finished (and the done refs a reply left
        # unconfirmed, once they are due again), say that nothing else is held, ask for
        # the next; send it to the replica the last reply named as the job's owner.
        route = routes[rank]
        done: list[ShardRef] = []
        unconfirmed = Unconfirmed()
        while time.perf_counter() < until:
            started = time.perf_counter()
            done = unconfirmed.due(started) + done
            request, rest = cycle_request(job, rank, done)
            try:
                if split:  # the done report, answered, before the fetch
                    report = request.model_copy(update={"want": 0})
                    await buses[rank].request(route.subject, report, ShardReply)
                    request = request.model_copy(update={"done": ()})
                reply = await buses[rank].request(route.subject, request, ShardReply)
            except RequestRefused as refused:
                if refused.reply.code != ErrorCode.BUSY:
                    raise
                busy += 1  # two replicas contending; the agent retries the same way
                route.on_failure(time.perf_counter())
                continue  # the same done refs go out again
            route.on_reply(reply.route, time.perf_counter())
            if measuring:
                latencies.append(time.perf_counter() - started)
            if reply.status != FetchStatus.OK:
                raise RuntimeError(f"rank {rank} got {reply.status}")
            unconfirmed.answered(reply.unconfirmed, started)
            done = rest + [g.ref() for g in reply.grants]

    warm_until = time.perf_counter() + 0.5
    await asyncio.gather(*(one_client(r, warm_until) for r in range(clients)))
    await replicas.go()
    servers_cpu = {name: _cpu_seconds(pid) for name, pid in replicas.server_pids.items()}
    measuring, cpu, started = True, time.process_time(), time.perf_counter()
    await asyncio.gather(*(one_client(r, started + seconds) for r in range(clients)))
    elapsed = time.perf_counter() - started
    client_cpu = time.process_time() - cpu
    counters = await replicas.counters()
    for name, pid in replicas.server_pids.items():
        servers_cpu[name] = _cpu_seconds(pid) - servers_cpu[name]
    for bus in buses:
        await bus.close()
    cycles = len(latencies)
    return {
        "cycles_per_s": cycles / elapsed,
        **percentiles(latencies),
        **_commit_figures(counters, cycles),
        "busy_refusals": busy,
        "service_cpu_us_per_cycle": counters["cpu_s"] / cycles * 1e6,
        "client_cpu_us_per_cycle": client_cpu / cycles * 1e6,
        **{f"{name}_cpu_us_per_cycle": v / cycles * 1e6 for name, v in servers_cpu.items()},
    }


def cycle_request(job: str, rank: int, done: list[ShardRef]) -> tuple[ShardFetch, list[ShardRef]]:
    """A cycle's request, and the done refs left for the next one: at most MAX_DONE go in
    one request, as the agent sends them. Refs a reply left unconfirmed pile up while the
    ledger's write waits (etcd slow, the machine stalled), and past MAX_DONE the request
    would not be valid."""
    sending, rest = done[:MAX_DONE], done[MAX_DONE:]
    return ShardFetch(job=job, rank=rank, epoch=0, done=tuple(sending), want=1, held=()), rest


def _commit_figures(counters: dict[str, float], cycles: int) -> dict[str, float]:
    """A shards replica's write-behind figures; the in-memory master's requests per
    cycle (it writes nothing)."""
    if "commits" not in counters:
        return {"requests_per_cycle": counters.get("requests", 0) / max(cycles, 1)}
    return {
        "requests_per_commit": counters["committed"] / max(counters["commits"], 1),
        # Per-stage: the pure ledger operations per request, and the etcd transaction's
        # wall time per commit as the service saw it (conflicted attempts included).
        "apply_us_per_request": counters["apply_s"] / max(counters["committed"], 1) * 1e6,
        "txn_ms_per_commit": counters["store_s"] / max(counters["commits"], 1) * 1000,
        "cas_conflicts": counters["cas_conflicts"],
        "early_share": counters["early"] / max(cycles, 1),
        "written_bytes_per_cycle": counters["written_bytes"] / max(cycles, 1),
        "budget_waits": counters["budget_waits"],
    }


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (Linux /proc), 0 if unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bench_ledger_size(
    replicas: ShardsReplicas, store: Store, *, dataset_size: int, shard_size: int, ranks: int,
    prefetch: int,
) -> dict[str, float]:  # fmt: skip
    """Bytes of the ledger stored in etcd once each of `ranks` ranks holds `prefetch`
    shards (granted through the service, as in a running job, reservations included: at
    this many ranks MAX_RESERVED leaves none), the fetch rate while
    filling it, and what one commit's encoding and one reload's decoding of it cost."""
    job = f"size{dataset_size}x{shard_size}"
    spec = JobSpec(job=job, world_size=ranks, dataset_size=dataset_size, shard_size=shard_size,
                   global_batch=ranks * 32)  # fmt: skip
    await replicas.register(store, spec)
    client = await Bus(replicas.nats, name="bench-size").connect()
    try:
        _, fetches_per_s = await grant_every_rank(client, replicas, job, ranks, prefetch)
    finally:
        await client.close()
    stored = await stored_ledger(store, replicas, job)
    return {
        "bytes": len(stored),
        "in_flight": ranks * prefetch,
        "fetches_per_s": fetches_per_s,
        **_codec_ms(stored),
    }


async def grant_every_rank(
    bus: Bus, replicas: ShardsReplicas, job: str, ranks: int, prefetch: int, concurrent: int = 64
) -> tuple[dict[int, tuple[ShardGrant, ...]], float]:
    """Each of `ranks` ranks asks for `prefetch` shards, `concurrent` requests at a time,
    as a job's ranks do at its start: their grants by rank, and the fetches per second."""
    subject = replicas.subjects.shards(job, "fetch")
    gate = asyncio.Semaphore(concurrent)
    held: dict[int, tuple[ShardGrant, ...]] = {}

    async def fetch(rank: int) -> None:
        async with gate:
            request = ShardFetch(job=job, rank=rank, epoch=0, want=prefetch, held=())
            held[rank] = (await bus.request(subject, request, ShardReply, timeout=60)).grants

    started = time.perf_counter()
    await asyncio.gather(*(fetch(r) for r in range(ranks)))
    return held, ranks / (time.perf_counter() - started)


async def stored_ledger(store: Store, replicas: ShardsReplicas, job: str) -> bytes:
    """The job's ledger as stored in etcd."""
    stored = await store.get(Keys(replicas.key_prefix).ledger(job))
    if stored is None:
        raise RuntimeError(f"no ledger stored for {job}")
    return stored.value


def _codec_ms(value: bytes) -> dict[str, float]:
    from antdt.services.shards.ledger import LedgerState
    from antdt.services.shards.ops import encode

    started = time.perf_counter()
    state = LedgerState.model_validate_json(value)
    decoded = time.perf_counter()
    encode(state)
    return {
        "decode_ms": (decoded - started) * 1000,
        "encode_ms": (time.perf_counter() - decoded) * 1000,
    }


async def bench_shards(
    cluster: EmbeddedCluster, *, clients: tuple[int, ...], seconds: float, replicas: int = 1,
    event_loop: loops.LoopKind = "auto",
) -> dict[int, dict[str, float]]:  # fmt: skip
    """bench_shards_cycles for each client count, against `replicas` replica processes;
    the replicas and the clients run on `event_loop` (the clients on a thread of their
    own when the caller's loop is another kind)."""
    run = _bench_shards(cluster, clients=clients, seconds=seconds, replicas=replicas,
                        event_loop=event_loop)  # fmt: skip
    if loops.running_kind() == loops.resolve(event_loop):
        return await run
    return await asyncio.to_thread(loops.run, run, event_loop)


async def _bench_shards(
    cluster: EmbeddedCluster, *, clients: tuple[int, ...], seconds: float, replicas: int,
    event_loop: loops.LoopKind,
) -> dict[int, dict[str, float]]:  # fmt: skip
    store = await Store(EtcdSettings(endpoint=cluster.etcd.endpoint)).connect()
    try:
        settings = {"event_loop": event_loop}
        async with ShardsReplicas(cluster, count=replicas, settings=settings) as running:
            return {
                n: await bench_shards_cycles(running, store, clients=n, seconds=seconds)
                for n in clients
            }
    finally:
        await store.close()


async def bench_ledger_sizes(
    cluster: EmbeddedCluster, *, dataset_size: int, shard_sizes: tuple[int, ...], ranks: int,
    prefetch: int,
) -> dict[int, dict[str, float]]:  # fmt: skip
    """bench_ledger_size for each shard size, against one replica process."""
    store = await Store(EtcdSettings(endpoint=cluster.etcd.endpoint)).connect()
    try:
        async with ShardsReplicas(cluster, count=1) as running:
            return {
                size: await bench_ledger_size(running, store, dataset_size=dataset_size,
                                              shard_size=size, ranks=ranks, prefetch=prefetch)
                for size in shard_sizes
            }  # fmt: skip
    finally:
        await store.close()
