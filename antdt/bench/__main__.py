"""Run the benchmarks against an embedded nats-server + etcd and print a table.

Each figure is paired with a baseline measured in the same invocation (machines here are
noisy; only ratios travel between runs). Results also go to runs/bench/results.json."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from antdt.bench.cases import (
    bench_agent_tracing,
    bench_detector_memory,
    bench_monitor_ingest,
    bench_raw_etcd_txn,
    bench_raw_pubsub,
    bench_shards_cycles,
)
from antdt.runtime.servers import EmbeddedCluster

console = Console(width=160)


async def run_all(cluster: EmbeddedCluster) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with console.status("raw nats-py pub/sub (baseline)"):
        raw = await bench_raw_pubsub(cluster.nats.url, messages=100_000)
    console.print(f"raw nats-py pub/sub: {raw['msgs_per_s']:,.0f} msgs/s")
    with console.status("monitor ingest, one replica"):
        ingest = await bench_monitor_ingest(cluster, events=60_000)
    console.print(f"monitor ingest: {ingest['events_per_s']:,.0f} events/s")
    rows.append(
        {
            "what": "monitor ingest (step events/s, one replica)",
            "value": ingest["events_per_s"],
            "baseline": raw["msgs_per_s"],
            "baseline_what": "raw nats-py pub/sub msgs/s",
            "target": ">= 50,000/s and ratio >= 0.25",
        }
    )
    for ranks in (256, 4096):
        memory = bench_detector_memory(ranks=ranks, windows=10)
        console.print(
            f"monitor memory: {memory['bytes_per_rank']:,.0f} bytes per tracked rank "
            f"({ranks} ranks, 10 windows)"
        )
        rows.append(
            {
                "what": f"monitor memory per tracked rank, bytes ({ranks} ranks, 10 windows)",
                "value": memory["bytes_per_rank"],
                "baseline": None,
                "baseline_what": "",
                "target": "reported",
            }
        )
    with console.status("agent per-step cost, tracing off vs on"):
        tracing = await bench_agent_tracing(cluster)
    console.print(
        f"agent per-step cost: {tracing['off_us']:.1f} µs untraced, {tracing['on_us']:.1f} µs "
        f"traced ({tracing['commands']} commands, {tracing['applied_spans']} apply spans)"
    )
    rows.append(
        {
            "what": "agent training-thread cost per step with tracing, µs",
            "value": tracing["on_us"],
            "baseline": tracing["off_us"],
            "baseline_what": "same, tracing off",
            "target": "ratio <= 1.05",
        }
    )
    with console.status("raw etcd transactions (baseline)"):
        txn = await bench_raw_etcd_txn(cluster.etcd.endpoint, seconds=3.0)
    for clients in (1, 2, 8):
        with console.status(f"shards fetch+done cycles, {clients} client(s)"):
            cycles = await bench_shards_cycles(cluster, clients=clients, seconds=4.0)
        rows.append(
            {
                "what": f"shards fetch+done cycles/s, {clients} client(s), durable in etcd",
                "value": cycles["cycles_per_s"],
                "p50_ms": cycles["p50_ms"],
                "p99_ms": cycles["p99_ms"],
                "baseline": txn["txn_per_s"],
                "baseline_what": "raw serial etcd txn/s",
                "target": ">= 1,000 (1 client), >= 4,000 (8 clients)",
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    table = Table(title="AntDT bench (ratios are against the same-run baseline)")
    for column in ("what", "value", "baseline", "ratio", "p50/p99 ms", "target"):
        table.add_column(column, justify="left" if column in ("what", "target") else "right")
    for row in rows:
        latency = f"{row['p50_ms']:.2f}/{row['p99_ms']:.2f}" if "p50_ms" in row else ""
        baseline = row["baseline"]
        table.add_row(
            row["what"],
            f"{row['value']:,.0f}",
            f"{baseline:,.0f} ({row['baseline_what']})" if baseline else "",
            f"{row['value'] / baseline:.2f}" if baseline else "",
            latency,
            row["target"],
        )
    console.print(table)


def main() -> None:
    from antdt.runtime.logs import configure_logging

    configure_logging("warning", "console")
    started = time.time()
    with EmbeddedCluster() as cluster:
        rows = asyncio.run(run_all(cluster))
    print_table(rows)
    out = Path("runs/bench")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    console.print(f"{time.time() - started:.0f}s; figures in {out / 'results.json'}")


if __name__ == "__main__":
    main()
