"""Shards benchmarks: fetch+done cycles against shards replicas (replicas.py) or the
in-memory master (master.py), and the raw etcd and NATS baselines that bound them."""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import time
from pathlib import Path
from typing import Any, Protocol

from antdt.agent.route import ShardRoute
from antdt.agent.stream_state import MAX_DONE
from antdt.agent.unconfirmed import Unconfirmed
from antdt.runtime import loops
from antdt.runtime.bus import Bus, RequestRefused
from antdt.runtime.config import EtcdSettings, NatsSettings
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Put, Store
from antdt.schemas import (
    ErrorCode,
    FetchStatus,
    JobSpec,
    ShardFetch,
    ShardRef,
    ShardReply,
    Subjects,
)
from bench.replicas import Children, ShardsReplicas
from bench.secured import CYCLES_JOB, Access

#: Numbers the cycles benches' jobs, so that no run takes up an earlier one's ledger.
_CYCLE_JOBS = itertools.count()


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
    url: str,
    *,
    seconds: float,
    clients: int = 1,
    event_loop: loops.LoopKind = "auto",
    nats_pid: int | None = None,
) -> dict[str, float]:
    """Baseline: bare request/reply over the Bus's request path (no pydantic), fetch-sized
    payloads, a responder process answering at once and `clients` connections here: the
    ceiling of a shards cycle over NATS, and the transport's CPU per request (clients,
    responder, nats-server at `nats_pid`)."""
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
    replicas: CycleServer,
    store: Store | None,
    *,
    clients: int,
    seconds: float,
    split: bool = False,
    job: str | None = None,
) -> dict[str, float]:
    """Each client (its own connection, like a rank) loops: report its shard done and fetch
    the next, in one request, durable in etcd before the reply; counters and CPU over the
    measured window only. Each call is a job of its own. `split`: two requests a cycle, as
    DLRover's client makes them (the in-memory master only). `job`: the job's name, where
    the clients may run that one only (agent users)."""
    job = job or f"cycles{clients}x{replicas.count}r{next(_CYCLE_JOBS)}{'s' if split else ''}"
    spec = JobSpec(
        job=job,
        world_size=clients,
        dataset_size=10**9,
        shard_size=10**4,
        global_batch=clients * 32,
        epochs=1,
    )
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


async def bench_shards(
    cluster: EmbeddedCluster,
    *,
    clients: tuple[int, ...],
    seconds: float,
    replicas: int = 1,
    event_loop: loops.LoopKind = "auto",
    access: Access | None = None,
) -> dict[int, dict[str, float]]:
    """bench_shards_cycles for each client count, against `replicas` replica processes;
    the replicas and the clients run on `event_loop` (the clients on a thread of their
    own when the caller's loop is another kind). `access`: secured servers (one client
    count: their agent user runs one job), instead of `cluster`."""
    run = _bench_shards(
        cluster,
        clients=clients,
        seconds=seconds,
        replicas=replicas,
        event_loop=event_loop,
        access=access,
    )
    if loops.running_kind() == loops.resolve(event_loop):
        return await run
    return await asyncio.to_thread(loops.run, run, event_loop)


async def _bench_shards(
    cluster: EmbeddedCluster,
    *,
    clients: tuple[int, ...],
    seconds: float,
    replicas: int,
    event_loop: loops.LoopKind,
    access: Access | None,
) -> dict[int, dict[str, float]]:
    if access is not None and len(clients) != 1:
        raise ValueError("secured servers: one client count (their agent runs one job)")
    etcd = access.etcd("shards") if access else EtcdSettings(endpoint=cluster.etcd.endpoint)
    job = CYCLES_JOB if access else None
    store = await Store(etcd).connect()
    try:
        settings = {"event_loop": event_loop}
        async with ShardsReplicas(
            cluster, count=replicas, settings=settings, access=access
        ) as running:
            return {
                n: await bench_shards_cycles(running, store, clients=n, seconds=seconds, job=job)
                for n in clients
            }
    finally:
        await store.close()
