"""Several hosts for end-to-end tests: network namespaces from antdt.testing.hostbed, each
with its own address and CPU budget; nats-server, etcd and the three services on a control
host; torchrun (`--rdzv-backend=antdt`) with the demo's training script on each worker
host. The test body runs as a coroutine in a thread inside the control host, so its bus
client and the services reach every host by address."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import EtcdSettings, NatsSettings, ServiceSettings
from antdt.schemas import (
    ActionRecord,
    ActionResult,
    Incident,
    NodeHeartbeat,
    NodeJoin,
    NodeState,
    RankHello,
    StepEvent,
    Subjects,
)
from antdt.testing.hostbed import Host, HostBed, Servers

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
RDZV_PORT = 29400


@dataclass
class Seen:
    """What the control plane said about the job, as the test's bus client heard it."""

    actions: list[ActionRecord] = field(default_factory=list)
    hellos: list[RankHello] = field(default_factory=list)
    steps: list[StepEvent] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    #: Each node's state, as its last join or heartbeat to the controller said.
    nodes: dict[str, NodeState] = field(default_factory=dict)
    #: When the test heard each action record, by action id (wall clock, seconds).
    heard_at: dict[str, float] = field(default_factory=dict)

    def applied(self, kind: str) -> list[ActionRecord]:
        return [a for a in self.actions if a.result == ActionResult.APPLIED and a.kind == kind]

    def max_step(self) -> int:
        return max((e.step for e in self.steps), default=-1)


@dataclass
class Cluster:
    """A bed with a control host running the servers and services, and worker hosts."""

    bed: HostBed
    control: Host
    workers: dict[str, Host]
    servers: Servers
    settings: ServiceSettings
    out: Path
    job: str
    world: int
    seen: Seen = field(default_factory=Seen)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    services: subprocess.Popen[bytes] | None = None

    def torchrun(self, host: str, env: dict[str, str], max_restarts: int = 3) -> None:
        """Start torchrun with the demo's training script on `host` (rank 0's host of the
        first round, `rendezvous`, hosts the rendezvous store)."""
        node = self.workers[host]
        first = next(iter(self.workers.values()))
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={self.world}:{self.world}",
            "--nproc-per-node=1",
            "--rdzv-backend=antdt",
            f"--rdzv-endpoint={first.address}:{RDZV_PORT}",
            f"--rdzv-id={self.job}",
            f"--rdzv-conf=is_host={'1' if node is first else '0'}",
            f"--local-addr={node.address}",
            f"--max-restarts={max_restarts}",
            "--monitor-interval=0.5",
            "-m",
            "antdt.demo.train",
        ]
        full = {
            **env,
            "ANTDT_HOST": host,
            "GLOO_SOCKET_IFNAME": "eth0",
            "PYTHONPATH": _pythonpath(),
        }
        log = self.out / f"torchrun-{host}.log"
        self.logs[host] = log
        with log.open("wb") as sink:
            self.procs[host] = self.bed.popen(
                node, argv, env=full, stdout=sink, stderr=subprocess.STDOUT
            )

    async def exit_codes(self, timeout: float) -> dict[str, int]:
        """Wait for every torchrun to exit; their exit codes by host."""
        codes = {}
        for host, proc in self.procs.items():
            codes[host] = await asyncio.to_thread(proc.wait, timeout)
        return codes

    def log_tail(self, host: str, lines: int = 30) -> str:
        text = self.logs[host].read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def open_cluster(
    bed: HostBed, workers: list[str], *, world: int, cpus: float, out: Path, job: str
) -> Cluster:
    """A control host and `workers` (the first `world` train, the rest wait as spares),
    each worker with `cpus` CPUs' worth of time."""
    control = bed.add_host("ctl")
    hosts = {name: bed.add_host(name, cpus=cpus) for name in workers}
    servers = bed.start_servers(control)
    settings = ServiceSettings(
        nats=NatsSettings(url=servers.nats_url, subject_prefix=f"antdt.{job}"),
        etcd=EtcdSettings(
            endpoint=servers.etcd_endpoint, key_prefix=f"/antdt-test/{job}/", lease_ttl_s=2
        ),
        replica_id=f"replica-{job}",
    )
    return Cluster(bed, control, hosts, servers, settings, out, job, world)


def run_in_control(cluster: Cluster, body: Callable[[], Awaitable[T]]) -> T:
    """Run `body` to completion in a thread inside the control host."""
    return cluster.bed.call(cluster.control, lambda: asyncio.run(body()))  # type: ignore[arg-type]


async def listen(cluster: Cluster, bus: Bus) -> None:
    subjects, seen, job = Subjects(cluster.settings.nats.subject_prefix), cluster.seen, cluster.job

    async def node(report: NodeJoin | NodeHeartbeat, _: Delivery) -> None:
        seen.nodes[report.host] = report.state

    async def keep(item: Any, _: Delivery) -> None:
        kind = type(item)
        target = {
            ActionRecord: seen.actions,
            RankHello: seen.hellos,
            StepEvent: seen.steps,
            Incident: seen.incidents,
        }[kind]
        target.append(item)
        if isinstance(item, ActionRecord):
            seen.heard_at.setdefault(item.action_id, time.time())

    await bus.subscribe(subjects.action(job), ActionRecord, keep)
    await bus.subscribe(subjects.hello(job, "*"), RankHello, keep)
    await bus.subscribe(subjects.step(job, "*"), StepEvent, keep)
    await bus.subscribe(subjects.incident(job), Incident, keep)
    await bus.subscribe(subjects.node_join(job), NodeJoin, node)
    await bus.subscribe(subjects.node_heartbeat(job), NodeHeartbeat, node)
    await bus.flush()


async def control_plane(cluster: Cluster, **settings: str) -> Bus:
    """The three services as one `antdt services` process in the control host (gRPC's
    own threads make etcd's sockets, so an etcd client cannot live in a thread that
    entered a namespace), and the test's bus client listening; `settings`: ANTDT_*
    variables of the services."""
    env = {
        "ANTDT_NATS__SUBJECT_PREFIX": cluster.settings.nats.subject_prefix,
        "ANTDT_ETCD__KEY_PREFIX": cluster.settings.etcd.key_prefix,
        "ANTDT_ETCD__LEASE_TTL_S": str(cluster.settings.etcd.lease_ttl_s),
        "ANTDT_REPLICA_ID": cluster.settings.replica_id,
        "ANTDT_TELEMETRY__LOG_FORMAT": "json",
        "PYTHONPATH": _pythonpath(),
        **settings,
    }
    argv = [sys.executable, "-m", "antdt.cli", "services"]
    argv += ["--nats-url", cluster.settings.nats.url]
    argv += ["--etcd-endpoint", cluster.settings.etcd.endpoint]
    log = cluster.out / "services.log"
    cluster.logs["services"] = log
    with log.open("wb") as sink:
        cluster.services = cluster.bed.popen(
            cluster.control, argv, env=env, stdout=sink, stderr=subprocess.STDOUT
        )
    await wait_until(
        lambda: "services ready" in log.read_text(errors="replace"), 90, "services", cluster
    )
    bus = await Bus(cluster.settings.nats, name="test").connect()
    await listen(cluster, bus)
    return bus


def stop_control_plane(cluster: Cluster) -> None:
    """SIGTERM, so that the services shut down in stages; the bed kills what is left."""
    proc = cluster.services
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)


def _pythonpath() -> str:
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def job_env(cluster: Cluster, **extra: str) -> dict[str, str]:
    """The environment every rank of the demo job gets (extra: ANTDT_* overrides)."""
    env = {
        "ANTDT_NATS__URL": cluster.settings.nats.url,
        "ANTDT_NATS__SUBJECT_PREFIX": cluster.settings.nats.subject_prefix,
        "ANTDT_JOB": cluster.job,
        "ANTDT_SAMPLE_LOG": str(cluster.out / "samples"),
        "ANTDT_DEMO_OUT": str(cluster.out),  # shared storage: rank 0 may move hosts
        "ANTDT_DEMO_CKPT_DIR": str(cluster.out),
        "ANTDT_DEMO_CKPT_EVERY": "100000",  # checkpoints only when the controller asks
        "ANTDT_TELEMETRY__LOG_FORMAT": "json",
    }
    env.update(extra)
    return env


def progress(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines() if x]


def throughput(rows: list[dict[str, Any]], first: int, last: int) -> float:
    """Samples per second over steps [first, last] of rank 0's progress records: the
    upper quartile of the per-step rates (a loaded machine only ever slows a step)."""
    window = sorted((r for r in rows if first <= r["step"] <= last), key=lambda r: r["step"])
    assert len(window) >= 5, (first, last, len(window))
    pairs = itertools.pairwise(window)
    rates = [b["samples"] / (b["t"] - a["t"]) for a, b in pairs if b["t"] > a["t"]]
    return statistics.quantiles(rates, n=4)[2]


async def wait_for_spare(cluster: Cluster, host: str, timeout: float) -> None:
    """Until `host` reports itself waiting for the next round (a free spare)."""
    await wait_until(
        lambda: cluster.seen.nodes.get(host) == NodeState.WAITING,
        timeout,
        f"{host} waiting as a spare",
        cluster,
    )


async def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, cluster: Cluster
) -> None:
    """Poll `condition`; on timeout fail with the torchrun logs' tails."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            tails = "\n".join(f"--- {h}\n{cluster.log_tail(h)}" for h in cluster.procs)
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        await asyncio.sleep(0.2)
