"""`make bench`: run the benchmarks against an embedded nats-server + etcd and print a table.

Each figure is paired with a baseline measured in the same invocation (machines here are
noisy; only ratios travel between runs). Results also go to runs/bench/results.json."""

from __future__ import annotations

import json
import time
from typing import Any

from rich.progress import Progress

from antdt.runtime import loops
from antdt.runtime.servers import EmbeddedCluster
from bench.cases import bench_agent_tracing, bench_detector_memory
from bench.checkpoints import bench_checkpoint, checkpoint_rows
from bench.contention import contention_rows
from bench.contention_figures import NeighbourTooWeak
from bench.cores import bench_rows as core_bench_rows
from bench.cores import core_rows, decode_row, print_cores
from bench.dataloader import bench_dataloader, dataloader_row
from bench.decisions import bench_rows, decision_rows, print_decisions
from bench.display import console, print_table
from bench.epoch_turn import epoch_turn_row
from bench.ingest import bench_monitor_ingest, bench_raw_pubsub
from bench.ingest_replicas import bench_ingest_replicas
from bench.latency import bench_incident_to_plan, bench_raw_request
from bench.ledger_writes import bench_ledger_writes
from bench.overload import overload_rows
from bench.restart_cost import FULL, bench_restart_cost, restart_rows, save_restart_chart
from bench.secured_rows import SecuredSizes, secured_rows
from bench.shards_rows import RUNS, shards_rows
from bench.sharing import sharing_rows
from bench.sim_speed import RANKS as SIM_RANKS
from bench.sim_speed import RUNS as SIM_RUNS
from bench.sim_speed import STEPS as SIM_STEPS
from bench.sim_speed import non_dedicated_row, sim_rows


async def run_all(cluster: EmbeddedCluster) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with console.status("raw nats-py pub/sub (baseline)"):
        raw = await bench_raw_pubsub(cluster.nats.url, messages=100_000)
    console.print(f"raw nats-py pub/sub: {raw['msgs_per_s']:,.0f} msgs/s")
    with console.status("monitor ingest, one replica"):
        ingest = await bench_monitor_ingest(cluster, events=100_000)
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
    rows.append(await monitor_burst_row(cluster, ingest["events_per_s"]))
    rows.append(await monitor_replicas_row(cluster))
    rows += await overload_rows(cluster)
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
        f"agent per-step cost, the training thread's CPU: {tracing['off_us']:.1f} µs untraced, "
        f"{tracing['on_us']:.1f} µs traced (medians of their rounds); traced over untraced "
        f"{tracing['ratio']:.2f} (median of {len(tracing['ratios'])} paired rounds, from "
        f"{min(tracing['ratios']):.2f} to {max(tracing['ratios']):.2f}); wall time "
        f"{tracing['off_wall_us']:.1f} against {tracing['on_wall_us']:.1f} µs (paired "
        f"{tracing['wall_ratio']:.2f}: GIL waits on this bench's services included); "
        f"{tracing['commands']} commands, {tracing['applied_spans']} apply spans"
    )
    rows.append(
        {
            "what": "agent training-thread CPU per step with tracing, µs",
            "value": tracing["on_us"],
            "baseline": tracing["off_us"],
            "baseline_what": "same, tracing off",
            # Paired: adjacent rounds see the same load from the rest of the machine, and
            # the medians of the two modes' rounds, taken apart, do not.
            "ratio": tracing["ratio"],
            "target": "ratio <= 1.05 (median of paired rounds); < 50 µs",
        }
    )
    rows += await dataloader_rows(cluster)
    with console.status("one policy decision at 100, 1,000 and 10,000 ranks"):
        decisions = decision_rows()
    print_decisions(decisions)
    rows += bench_rows(decisions)
    with console.status("detector, health and ledger per operation, 100 to 10,000 ranks"):
        cores = core_rows()
    print_cores(cores)
    rows += core_bench_rows(cores)
    with console.status("a health of 10,000 ranks decoded: columns and rows"):
        rows.append(decode_row())
    rows += simulator_speed_rows()
    with console.status("the simulator: antdt-nd in the non-dedicated scenario"):
        rows.append(non_dedicated_row())
    rows += await shards_rows(cluster)
    rows += await secured_rows(cluster, SecuredSizes())
    rows.append(await epoch_turn_row(cluster))
    rows += await ledger_write_rows(cluster)
    rows += await checkpoint_rows_of(cluster)
    rows += await incident_to_plan_rows(cluster)
    rows += await contention_or_failure(cluster)
    rows += await sharing_rows(cluster)
    rows += await restart_cost_rows(cluster)
    return rows


def simulator_speed_rows() -> list[dict[str, Any]]:
    """The simulator's comparison at the target's size (minutes), a bar per run."""
    with Progress(console=console) as bar:
        tasks = {
            run: bar.add_task(f"simulator, {SIM_RANKS:,} ranks: {run}", total=SIM_STEPS)
            for run in SIM_RUNS
        }
        rows = sim_rows(lambda run, done: bar.update(tasks[run], completed=done))
    for run, seconds in rows[0]["details"]["cpu_s"].items():
        console.print(f"simulator, {SIM_RANKS:,} x {SIM_STEPS:,} steps, {run}: {seconds:.1f} CPU s")
    return rows


async def dataloader_rows(cluster: EmbeddedCluster) -> list[dict[str, Any]]:
    """The DataLoader path against a plain DataLoader: a 3-layer MLP of width 1024 (the
    loader's workers keep ahead), and of width 256, a step of about 2 ms where the two
    workers are the bottleneck and any CPU the control plane takes shows."""
    rows = []
    for width in (1024, 256):
        with console.status(f"DataLoader through the agent vs a plain DataLoader, width {width}"):
            got = await bench_dataloader(cluster, width=width)
        console.print(
            f"DataLoader step, width {width}: {got['agent_ms']:.2f} ms through the agent, "
            f"{got['plain_ms']:.2f} ms plain; paired ratio {got['ratio']:.3f} (rounds from "
            f"{min(got['ratios']):.3f} to {max(got['ratios']):.3f}); training thread's CPU "
            f"{got['agent_cpu_ms']:.2f} vs {got['plain_cpu_ms']:.2f} ms"
        )
        rows.append(dataloader_row(got, target=width == 1024))
    return rows


async def restart_cost_rows(cluster: EmbeddedCluster) -> list[dict[str, Any]]:
    """AntDT's KILL_RESTART (antdt launch, torchrun) against torchrun's own restart of
    the same job after a kill -9, in this run; the bars go to runs/bench/restart.png."""
    with console.status("restart cost: KILL_RESTART and torchrun's own restart, 2 ranks"):
        got = await bench_restart_cost(cluster, FULL, RUNS / "restart")
    console.print(
        "restart cost, trigger to every rank stepping again: "
        + "; ".join(f"{case} {seconds:.2f} s" for case, seconds in got.items())
        + f" ({save_restart_chart(got, RUNS / 'restart.png')})"
    )
    return restart_rows(got)


async def contention_or_failure(cluster: EmbeddedCluster) -> list[dict[str, Any]]:
    """The real-contention row, or a failed row (the bench then exits non-zero) when the
    neighbour could not slow its rank: the other rows' figures are written all the same."""
    try:
        return await contention_rows(cluster)
    except NeighbourTooWeak as weak:
        console.print(f"[bold red]the real-contention row failed: {weak}")
        return [
            {
                "what": "2 gloo ranks pinned one per core, a noisy neighbour: lb-bsp vs none",
                "value": 0.0,
                "baseline": None,
                "baseline_what": "",
                "target": "FAILED: the neighbour did not slow its rank",
                "failed": str(weak),
            }
        ]


async def monitor_burst_row(cluster: EmbeddedCluster, rate: float) -> dict[str, Any]:
    """One replica given 1.2 million step events at once (about 20 s of its ingest, four
    times what it ingests in its lease's TTL of 5 s), as 63 of the job's 64 ranks come
    back from a stall: the first events also resolve 63 incidents."""
    events = 1_200_000
    with console.status(f"monitor under a burst of {events:,} step events"):
        burst = await bench_monitor_ingest(cluster, events=events, stalled_first=True)
    console.print(
        f"monitor burst: {events:,} events ({events / rate:.0f} s of its ingest rate) as 63 "
        f"stalled ranks come back: "
        f"ingested at {burst['events_per_s']:,.0f}/s, {burst['lost']:,} lost "
        f"({burst['dropped']:,} dropped behind a full queue), {burst['jobs_lost']} jobs lost "
        f"with the lease, loop held at most {burst['longest_hold_s'] * 1000:.0f} ms; the 63 "
        f"stalls' resolutions all out {burst['resolved_s']:.2f} s after the first event"
    )
    return {
        "what": f"monitor under a burst of {events:,} step events, 63 stalls resolving "
        f"({burst['lost']:,} lost, "
        f"{burst['jobs_lost']} jobs lost): longest loop hold, ms",
        "value": burst["longest_hold_s"] * 1000,
        "baseline": None,
        "baseline_what": "",
        "target": "< 250 ms (lease TTL 5 s); no job lost; resolutions out",
        "details": burst,
    }


async def monitor_replicas_row(cluster: EmbeddedCluster) -> dict[str, Any]:
    """Two jobs' step events ingested by two replicas (one job each, by placement), each
    in its own process, against the same events ingested by one replica."""
    events = 100_000
    with console.status(f"monitor ingest, {events:,} events of each of 2 jobs, 1 then 2 replicas"):
        shared = await bench_ingest_replicas(cluster, events=events)
    one, two = shared["one"], shared["two"]
    console.print(
        f"monitor replicas: 2 jobs' step events at {two['events_per_s']:,.0f}/s with 2 "
        f"replicas (received {', '.join(f'{n:,}' for n in two['per_replica'])}; jobs "
        f"{two['jobs_per_replica']}), {one['events_per_s']:,.0f}/s with one: "
        f"x{shared['ratio']:.2f}; lost {one['lost']:,} and {two['lost']:,}"
    )
    return {
        "what": "monitor ingest, 2 jobs over 2 replicas (step events/s, all replicas)",
        "value": two["events_per_s"],
        "baseline": one["events_per_s"],
        "baseline_what": "same events, one replica",
        "target": "ratio > 1: replicas add capacity (each receives its own jobs' events)",
        "details": shared,
    }


async def ledger_write_rows(cluster: EmbeddedCluster) -> list[dict[str, Any]]:
    """Bytes a 1,000-rank job's ledger writes put into etcd's history per second, under
    the default write budget, against the same load unpaced."""
    ranks, every_s = 1000, 5.0
    results = {}
    for name, budget in (("unpaced", 0.0), ("budget", None)):
        with console.status(f"ledger writes, {ranks} ranks asking every {every_s:.0f} s, {name}"):
            results[name] = await bench_ledger_writes(
                cluster, ranks=ranks, every_s=every_s, seconds=8.0, budget=budget
            )
        got = results[name]
        console.print(
            f"ledger writes, {name}: {got['written_bytes_per_s'] / 2**20:.3f} MiB/s into etcd, "
            f"{got['commits_per_s']:.0f} writes/s for {got['requests_per_s']:.0f} requests/s, "
            f"fetch p50 {got['p50_ms']:.1f} ms, p99 {got['p99_ms']:.1f} ms, "
            f"service CPU {got['service_cpu_share']:.0%}"
        )
    paced, unpaced = results["budget"], results["unpaced"]
    return [
        {
            "what": f"ledger bytes/s into etcd's history, {ranks} ranks asking every "
            f"{every_s:.0f} s, default write budget",
            "value": paced["written_bytes_per_s"],
            "p50_ms": paced["p50_ms"],
            "p99_ms": paced["p99_ms"],
            "baseline": unpaced["written_bytes_per_s"],
            "baseline_what": "same load, unpaced",
            "target": "<= 1 MiB/s (the budget)",
            "details": {"paced": paced, "unpaced": unpaced},
        }
    ]


async def checkpoint_rows_of(cluster: EmbeddedCluster) -> list[dict[str, Any]]:
    """Every rank of a 10^3- and a 10^4-rank job commits one checkpoint at once."""
    results = {}
    for ranks in (1000, 10_000):
        with console.status(f"checkpoint of {ranks:,} ranks through one replica"):
            got = results[ranks] = await bench_checkpoint(cluster, ranks=ranks)
        console.print(
            f"checkpoint, {ranks:,} ranks: complete in {got['complete_s']:.1f} s, "
            f"{got['commits_per_s']:,.0f} commits/s (fetches {got['fetches_per_s']:,.0f}/s), "
            f"{got['requests_per_write']:.0f} commits per write, peak ledger "
            f"{got['peak_bytes']:,.0f} bytes ({got['peak_bytes_as_objects']:,.0f} as objects); "
            f"every rank restored it in {got['restore_s']:.2f} s"
        )
    return checkpoint_rows(results)


async def incident_to_plan_rows(cluster: EmbeddedCluster) -> list[dict[str, Any]]:
    """Incident → plan on every rank (µs), against a raw request/reply round trip."""
    with console.status("raw nats-py request/reply (baseline)"):
        rtt = await bench_raw_request(cluster.nats.url, rounds=1000)
    console.print(f"raw request/reply: p50 {rtt['p50_ms']:.2f} ms, p99 {rtt['p99_ms']:.2f} ms")
    rows = []
    for ranks in (4, 32):
        with console.status(f"incident -> plan on every rank, {ranks} ranks"):
            got = await bench_incident_to_plan(cluster, ranks=ranks, rounds=200)
        console.print(
            f"incident -> plan on every rank ({ranks} ranks): p50 {got['p50_ms']:.2f} ms, "
            f"p99 {got['p99_ms']:.2f} ms; -> ActionRecord p99 {got['record_p99_ms']:.2f} ms"
        )
        rows.append(
            {
                "what": f"incident -> plan on every rank, p99 µs ({ranks} ranks, lb-bsp)",
                "value": got["p99_ms"] * 1000,
                "p50_ms": got["p50_ms"],
                "p99_ms": got["p99_ms"],
                "record_p99_ms": got["record_p99_ms"],
                "baseline": rtt["p99_ms"] * 1000,
                "baseline_what": "raw request/reply p99 µs",
                "target": "p99 < 100 ms (100,000 µs)",
            }
        )
    return rows


def main() -> None:
    import argparse

    from antdt.runtime.telemetry.logs import configure_logging

    argparse.ArgumentParser(prog="python -m bench", description=__doc__).parse_args()
    configure_logging("warning", "console")
    started = time.time()
    with EmbeddedCluster() as cluster:
        rows = loops.run(run_all(cluster), "auto")
    print_table(rows)
    out = RUNS
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    from bench.chart import save_chart

    picture = save_chart(rows, out / "bench.png")
    console.print(f"{time.time() - started:.0f}s; figures in {out / 'results.json'}, {picture}")
    failed = [row["failed"] for row in rows if "failed" in row]
    if failed:
        raise SystemExit("make bench failed: " + "; ".join(failed))


if __name__ == "__main__":
    main()
