"""The cost of the production security (NATS users per role, TLS to NATS and etcd, etcd
users) on the monitor's ingest and on the shards' fetch+done cycles: each measured on
plaintext servers and on secured ones (secured.py), back to back in the same run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from antdt.runtime.servers import EmbeddedCluster
from bench.display import console
from bench.ingest import bench_monitor_ingest
from bench.secured import secured_servers
from bench.shards import bench_shards

TARGET = "ratio >= 0.8 (secured over plaintext, same run)"


@dataclass(frozen=True)
class SecuredSizes:
    events: int = 100_000  # step events ingested, per mode
    clients: int = 8  # shards clients, one connection each
    seconds: float = 3.0  # of cycles, per mode


SHORT = SecuredSizes(events=6_400, clients=2, seconds=0.5)


async def secured_rows(cluster: EmbeddedCluster, sizes: SecuredSizes) -> list[dict[str, Any]]:
    with console.status("auth + TLS: monitor ingest and shards cycles, plaintext then secured"):
        plain_ingest = await bench_monitor_ingest(cluster, events=sizes.events)
        plain_cycles = await _cycles(cluster, sizes, None)
        async with secured_servers() as access:
            ingest = await bench_monitor_ingest(cluster, events=sizes.events, access=access)
            cycles = await _cycles(cluster, sizes, access)
    console.print(
        f"auth + TLS: monitor ingest {ingest['events_per_s']:,.0f} events/s secured, "
        f"{plain_ingest['events_per_s']:,.0f} plaintext "
        f"(x{ingest['events_per_s'] / plain_ingest['events_per_s']:.2f}; lost {ingest['lost']:,} "
        f"and {plain_ingest['lost']:,}); shards cycles {cycles['cycles_per_s']:,.0f}/s secured, "
        f"{plain_cycles['cycles_per_s']:,.0f}/s plaintext "
        f"(x{cycles['cycles_per_s'] / plain_cycles['cycles_per_s']:.2f}; p50 "
        f"{cycles['p50_ms']:.2f} against {plain_cycles['p50_ms']:.2f} ms)"
    )
    return [
        {
            "what": "monitor ingest with NATS users + TLS (step events/s, one replica)",
            "value": ingest["events_per_s"],
            "baseline": plain_ingest["events_per_s"],
            "baseline_what": "same, plaintext",
            "target": TARGET,
            "details": {"secured": ingest, "plaintext": plain_ingest},
        },
        {
            "what": f"shards fetch+done cycles/s with users + TLS on NATS and etcd, "
            f"{sizes.clients} clients",
            "value": cycles["cycles_per_s"],
            "baseline": plain_cycles["cycles_per_s"],
            "baseline_what": "same, plaintext",
            "p50_ms": cycles["p50_ms"],
            "p99_ms": cycles["p99_ms"],
            "target": TARGET,
            "details": {"secured": cycles, "plaintext": plain_cycles},
        },
    ]


async def _cycles(cluster: EmbeddedCluster, sizes: SecuredSizes, access: Any) -> dict[str, float]:
    got = await bench_shards(
        cluster, clients=(sizes.clients,), seconds=sizes.seconds, access=access
    )
    return got[sizes.clients]
