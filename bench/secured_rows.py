"""The cost of the production security (NATS users per role, TLS to NATS and etcd, etcd
users) on the monitor's ingest and on the shards' fetch+done cycles: each measured on
servers of their own, plaintext and secured (secured.py), started alike, in rounds that
alternate which goes first; the ratio is the median of the rounds' ratios."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from antdt.runtime.servers import EmbeddedCluster
from bench.display import console, listed
from bench.ingest import bench_monitor_ingest
from bench.secured import Access, bench_servers
from bench.shards import bench_shards, cpu_per_cycle

TARGET = "ratio >= 0.8 (secured over plaintext, median of paired rounds)"


@dataclass(frozen=True)
class SecuredSizes:
    events: int = 100_000  # step events ingested, per mode and round
    clients: int = 8  # shards clients, one connection each
    seconds: float = 3.0  # of cycles, per mode and round
    rounds: int = 3


SHORT = SecuredSizes(events=6_400, clients=2, seconds=0.5, rounds=1)


async def secured_rows(cluster: EmbeddedCluster, sizes: SecuredSizes) -> list[dict[str, Any]]:
    rounds: list[dict[bool, dict[str, dict[str, float]]]] = []
    for n in range(sizes.rounds):
        order = (False, True) if n % 2 == 0 else (True, False)
        with console.status(f"auth + TLS: ingest and shards cycles, round {n + 1}"):
            rounds.append({secure: await _measure(cluster, sizes, secure) for secure in order})
    ingest = _row(
        rounds,
        "ingest",
        "events_per_s",
        "monitor ingest with NATS users + TLS (step events/s, one replica)",
    )
    cycles = _row(
        rounds,
        "cycles",
        "cycles_per_s",
        f"shards fetch+done cycles/s with users + TLS on NATS and etcd, {sizes.clients} clients",
    )
    cycles |= {
        k: statistics.median(r[True]["cycles"][k] for r in rounds) for k in ("p50_ms", "p99_ms")
    }
    cpu = statistics.median(
        cpu_per_cycle(r[False]["cycles"]) / cpu_per_cycle(r[True]["cycles"]) for r in rounds
    )
    cycles["cpu_ratio"] = cpu  # steadier than the rate on a shared machine
    console.print(
        f"auth + TLS: monitor ingest {ingest['value']:,.0f} events/s secured, "
        f"{ingest['baseline']:,.0f} plaintext (x{ingest['ratio']:.2f}; rounds "
        f"{listed(ingest['ratios'])}); shards cycles {cycles['value']:,.0f}/s secured, "
        f"{cycles['baseline']:,.0f}/s plaintext (x{cycles['ratio']:.2f}; rounds "
        f"{listed(cycles['ratios'])}; CPU per cycle, all processes, plaintext over secured "
        f"x{cpu:.2f}), medians of {len(rounds)} rounds"
    )
    return [ingest, cycles]


async def _measure(cluster: EmbeddedCluster, sizes: SecuredSizes, secure: bool) -> dict[str, Any]:
    async with bench_servers(secure=secure) as access:
        ingest = await bench_monitor_ingest(cluster, events=sizes.events, access=access)
        cycles = await _cycles(cluster, sizes, access)
    return {"ingest": ingest, "cycles": cycles}


def _row(
    rounds: list[dict[bool, dict[str, Any]]], case: str, figure: str, what: str
) -> dict[str, Any]:
    secured = [r[True][case][figure] for r in rounds]
    plain = [r[False][case][figure] for r in rounds]
    ratios = [s / p for s, p in zip(secured, plain, strict=True)]
    return {
        "what": what,
        "value": statistics.median(secured),
        "baseline": statistics.median(plain),
        "baseline_what": "same, plaintext",
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "target": TARGET,
        "details": [{"secured": r[True][case], "plaintext": r[False][case]} for r in rounds],
    }


async def _cycles(
    cluster: EmbeddedCluster, sizes: SecuredSizes, access: Access
) -> dict[str, float]:
    got = await bench_shards(
        cluster, clients=(sizes.clients,), seconds=sizes.seconds, access=access
    )
    return got[sizes.clients]
