"""The shards cycles and their baselines (the in-memory master with AntDT's one request
and DLRover's two, and DLRover's own master where at hand), measured in turns: for each
client count each runs in turn, and the figures are each one's median and the median of
the per-turn ratios (a shared machine's speed drifts within a minute)."""

from __future__ import annotations

import statistics
from typing import Any

from antdt.runtime.config import EtcdSettings
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store
from bench.dlrover import DLRoverMaster
from bench.master import MemoryMaster, bench_memory_master_cycles
from bench.replicas import ShardsReplicas
from bench.shards import bench_shards_cycles


async def bench_paired_cycles(
    cluster: EmbeddedCluster,
    *,
    clients: tuple[int, ...],
    seconds: float,
    turns: int,
    on_turn: Any = None,
    real: DLRoverMaster | None = None,
) -> dict[int, dict[str, Any]]:
    """Per client count: "master", "dlrover" (the master, two requests a cycle) and "shards":
    median figures; "ratio"/"ratios": shards over master, median and per turn;
    "dlrover_ratio"/"dlrover_ratios": the same against "dlrover"; with `real` (DLRover's own
    master, running) also "real", "real_ratio", "real_ratios". `on_turn(n, turn)` runs
    before each turn."""
    store = await Store(EtcdSettings(endpoint=cluster.etcd.endpoint)).connect()
    pids = {"nats": cluster.nats.pid}
    results: dict[int, dict[str, Any]] = {}
    try:
        async with (
            MemoryMaster(cluster.nats.url, pids) as master,
            ShardsReplicas(cluster, count=1) as replica,
        ):
            for n in clients:
                runs: dict[str, list[dict[str, float]]] = {
                    "master": [],
                    "dlrover": [],
                    "shards": [],
                    "real": [],
                }
                for turn in range(turns):
                    if on_turn is not None:
                        on_turn(n, turn)
                    runs["master"].append(await bench_memory_master_cycles(master, n, seconds))
                    runs["dlrover"].append(
                        await bench_memory_master_cycles(master, n, seconds, split=True)
                    )
                    if real is not None:
                        runs["real"].append(await real.run(n, seconds))
                    runs["shards"].append(
                        await bench_shards_cycles(replica, store, clients=n, seconds=seconds)
                    )
                results[n] = _paired(runs)
    finally:
        await store.close()
    return results


def _paired(runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Median figures of each series and the shards' per-turn ratios to each baseline."""
    paired: dict[str, Any] = {
        name: median_figures(figures) for name, figures in runs.items() if figures
    }
    for name, key in (("master", "ratio"), ("dlrover", "dlrover_ratio"), ("real", "real_ratio")):
        if runs[name]:
            ratios = turn_ratios(runs["shards"], runs[name])
            paired[key], paired[f"{key}s"] = statistics.median(ratios), ratios
    return paired


def turn_ratios(runs: list[dict[str, float]], baselines: list[dict[str, float]]) -> list[float]:
    """Each turn's rate over its baseline's, measured seconds apart."""
    return [
        run["cycles_per_s"] / baseline["cycles_per_s"]
        for run, baseline in zip(runs, baselines, strict=True)
    ]


def median_figures(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the runs (the run with the median rate would mix one
    run's luck into every figure; medians figure by figure do not)."""
    return {name: statistics.median(run[name] for run in runs) for name in runs[0]}
