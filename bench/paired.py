"""The shards cycles and their baselines, the in-memory master driven with AntDT's one
request per cycle and with DLRover's two (master.py), and DLRover's own master and client
(dlrover.py) where a Python with DLRover is at hand, measured in turns.

A shared machine's speed drifts by tens of percent within a minute (other tenants, CPU
steal), and a baseline measured a minute before the figure it divides can move the ratio
by as much as the change under test. So for each client count the bench runs master,
DLRover-style master, replica, ... (all kept running, each run its own job) and reports the
median of each, and the median of the per-turn ratios: a turn's runs are seconds apart,
under the same load."""

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
    """For each client count: {"master": median figures, "dlrover": the master's
    median figures with DLRover's two requests per cycle, "shards": median figures,
    "ratio": median of shards/master per turn, "ratios": each turn's, "dlrover_ratio"
    and "dlrover_ratios": the same against the two-request master}; with `real` (DLRover's
    own master, running) also "real", "real_ratio" and "real_ratios" against it.
    `on_turn(n, turn)` is called before each turn (progress)."""
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
