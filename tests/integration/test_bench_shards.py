"""The shards bench's drivers, briefly, against the session's real nats-server and etcd:
the cycles it reports were really served (by a shards replica process, and by the
in-memory master process it is compared with), so `make bench` cannot rot unnoticed."""

from __future__ import annotations

import pytest

from antdt.bench.master import MemoryShards, bench_memory_master
from antdt.bench.shards import bench_shards
from antdt.runtime.servers import EmbeddedCluster
from antdt.schemas import FetchStatus, JobSpec, ShardFetch

pytestmark = pytest.mark.integration


def test_the_memory_master_grants_each_shard_once_and_pops_done_reports() -> None:
    spec = JobSpec(job="m", world_size=2, dataset_size=25, shard_size=10, global_batch=2)
    master = MemoryShards(spec)
    first = master.fetch(ShardFetch(job="m", rank=0, epoch=0, want=2))
    assert [(g.shard, g.start, g.end) for g in first.grants] == [(0, 0, 10), (1, 10, 20)]
    # A done report from a rank that does not hold the shard changes nothing.
    last = master.fetch(ShardFetch(job="m", rank=1, epoch=0, done=(first.grants[0].ref(),)))
    assert [(g.shard, g.end) for g in last.grants] == [(2, 25)] and master.done == 0
    refs = tuple(g.ref() for g in first.grants)
    after = master.fetch(ShardFetch(job="m", rank=0, epoch=0, done=refs))
    assert after.status is FetchStatus.EPOCH_DONE and master.done == 2
    assert master.doing == {2: 1}


async def test_both_drivers_serve_real_cycles(cluster: EmbeddedCluster) -> None:
    master = await bench_memory_master(cluster, clients=(2,), seconds=0.3)
    shards = await bench_shards(cluster, clients=(2,), seconds=0.3)
    for figures in (master[2], shards[2]):
        assert figures["cycles_per_s"] > 10 and figures["service_cpu_us_per_cycle"] > 0
    assert "requests_per_commit" not in master[2]  # nothing is written behind
    assert shards[2]["requests_per_commit"] >= 1 and shards[2]["cas_conflicts"] == 0
