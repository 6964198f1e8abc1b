"""DLRover's own shard master and client, the shards bench's baseline for issue #3, run
briefly from the environment `make bench-test` and `make bench` make (.venv-dlrover): the
cycles it reports were really served by DLRover's gRPC master to its ShardingClient."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from antdt.runtime.servers import EmbeddedCluster
from bench.dlrover import DLRoverMaster, dlrover_python
from bench.paired import bench_paired_cycles

pytestmark = pytest.mark.integration


def _python() -> Path:
    python = dlrover_python()
    if python is None:
        pytest.fail(
            "no Python with DLRover: `make bench-test` makes .venv-dlrover (or set "
            "ANTDT_BENCH_DLROVER_PYTHON)"
        )
    return python


async def test_dlrover_own_master_serves_its_own_clients(tmp_path: Path) -> None:
    async with DLRoverMaster(_python(), tmp_path / "dlrover.log", workers=2) as master:
        assert master.address.startswith("127.0.0.1:")
        # The two clients' 3 s answer lists thousands of latencies: a line past asyncio's
        # default 64 KiB once made `make bench` fail to read it.
        plan = ((1, 0.5), (2, 3.0), (1, 0.5))
        runs = [await master.run(clients, seconds) for clients, seconds in plan]
    for (clients, seconds), figures in zip(plan, runs, strict=True):
        assert figures["cycles_per_s"] > 10
        assert 0 < figures["p50_ms"] <= figures["p99_ms"]
        # A client's cycles follow each other: the half of them that last the median or
        # longer fit in its time, so no cycle is counted that was not timed.
        assert figures["cycles"] / 2 * figures["p50_ms"] / 1000 <= clients * seconds
        # The master's threads serve in this process; each client is a process of its own.
        assert figures["master_cpu_us_per_cycle"] > 0 and figures["client_cpu_us_per_cycle"] > 0


async def test_a_dlrover_that_cannot_start_says_where_its_log_is(tmp_path: Path) -> None:
    log = tmp_path / "dlrover.log"
    with pytest.raises(RuntimeError, match=f"exited with 1; its log: {log}"):
        async with DLRoverMaster(Path("/bin/false"), log):
            pass


async def test_paired_turns_put_dlrover_own_master_beside_the_replica(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    async with DLRoverMaster(_python(), tmp_path / "dlrover.log", workers=1) as real:
        paired = await bench_paired_cycles(cluster, clients=(1,), seconds=0.3, turns=2, real=real)
    pair = paired[1]
    assert pair["real"]["cycles_per_s"] > 10 and len(pair["real_ratios"]) == 2
    assert pair["real_ratio"] == statistics.median(pair["real_ratios"]) > 0
    assert "dlrover_ratio" in pair and "ratio" in pair  # the in-memory master's turns too
