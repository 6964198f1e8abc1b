"""The overload rows, small: 10x the sustainable rate for 2 s into a monitor replica and
a shards replica, each in its own process, against the suite's real servers."""

from __future__ import annotations

from antdt.runtime.servers import EmbeddedCluster
from bench.overload import FACTOR, bench_monitor_overload, monitor_problem, shards_problem
from bench.overload_shards import drive_shards


async def test_a_monitor_at_ten_times_its_rate_drops_counts_and_stays_bounded(
    cluster: EmbeddedCluster,
) -> None:
    got = await bench_monitor_overload(cluster, seconds=2.0, backlog_mb=4, base_events=8_000)
    assert got["alive"], got
    assert got["factor"] > FACTOR / 2, got  # the load offered really was far past its rate
    assert got["dropped"] > 0 and got["unaccounted"] == 0, got
    assert monitor_problem(got) is None, got


async def test_a_shards_replica_at_ten_times_its_rate_grants_each_shard_once(
    cluster: EmbeddedCluster,
) -> None:
    got = await drive_shards(cluster, seconds=2.0, factor=FACTOR, shards=24_000)
    assert got["alive"], got
    assert got["factor"] > FACTOR / 2, got
    assert got["dropped"] + got["refused"] > 0, got  # counted in the replica's metrics
    assert shards_problem(got) is None, got
