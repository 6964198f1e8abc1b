"""The DataLoader bench against the session's real nats-server and etcd: both paths
train the same steps and the row carries the paired ratio next to its ceiling."""

from __future__ import annotations

import pytest

from antdt.runtime.servers import EmbeddedCluster
from bench.dataloader import bench_dataloader, dataloader_row

pytest.importorskip("torch")
pytestmark = pytest.mark.integration


async def test_both_paths_run_and_the_row_pairs_them(cluster: EmbeddedCluster) -> None:
    got = await bench_dataloader(cluster, width=64, batch=16, workers=2, steps=10, rounds=2)
    assert len(got["ratios"]) == 2 and got["plain_ms"] > 0 and got["agent_ms"] > 0
    assert got["agent_cpu_ms"] > 0 and got["plain_cpu_ms"] > 0
    row = dataloader_row(got)
    assert row["ratio"] == got["ratio"] and "1.02" in row["target"]
