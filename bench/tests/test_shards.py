"""The shards bench's drivers, briefly, against the session's real nats-server and etcd:
the cycles it reports were really served (by a shards replica process, and by the
in-memory master process it is compared with), so `make bench` cannot rot unnoticed."""

from __future__ import annotations

import pytest

from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store
from antdt.schemas import FetchStatus, JobSpec, ShardFetch, ShardRef
from bench.epoch_turn import bench_epoch_turn
from bench.ledger_writes import bench_ledger_writes
from bench.master import MemoryMaster, MemoryShards, bench_memory_master_cycles
from bench.paired import bench_paired_cycles
from bench.shards import (
    bench_raw_nats_request,
    bench_shards,
    cpu_per_cycle,
    cycle_request,
)

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


def test_a_cycle_sends_at_most_64_done_refs_and_keeps_the_rest() -> None:
    # Refs left unconfirmed pile up while a ledger write waits (a stalled machine: 73 did
    # in one `make bench`); the agent sends 64 at most, and so does the bench's client.
    done = [ShardRef(epoch=0, shard=s, attempt=0) for s in range(100)]
    request, rest = cycle_request("j", 3, done)
    assert request.done == tuple(done[:64]) and rest == done[64:]
    request, rest = cycle_request("j", 3, rest)
    assert request.done == tuple(done[64:]) and rest == []
    assert (request.rank, request.want, request.held) == (3, 1, ())


async def test_both_drivers_serve_real_cycles(cluster: EmbeddedCluster) -> None:
    async with MemoryMaster(cluster.nats.url, {"nats": cluster.nats.pid}) as running:
        master = {2: await bench_memory_master_cycles(running, 2, 0.3)}
    shards = await bench_shards(cluster, clients=(2,), seconds=0.3)
    for figures in (master[2], shards[2]):
        assert figures["cycles_per_s"] > 10 and figures["service_cpu_us_per_cycle"] > 0
    assert "requests_per_commit" not in master[2]  # nothing is written behind
    assert shards[2]["requests_per_commit"] >= 1 and shards[2]["cas_conflicts"] == 0


async def test_every_cycles_run_is_a_job_of_its_own(
    cluster: EmbeddedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Runs that shared a job shared its 10^5 shards: on a fast machine `make bench` ran
    # out of them (EPOCH_DONE) in its event-loop rows.
    jobs: list[str] = []
    async with MemoryMaster(cluster.nats.url, {"nats": cluster.nats.pid}) as running:
        register = running.register

        async def recording(store: Store | None, spec: JobSpec) -> None:
            jobs.append(spec.job)
            await register(store, spec)

        monkeypatch.setattr(running, "register", recording)
        for _ in range(2):
            await bench_memory_master_cycles(running, 1, 0.1)
    assert len(jobs) == 2 and jobs[0] != jobs[1], jobs


async def test_paired_turns_serve_both_and_report_the_median_turn(
    cluster: EmbeddedCluster,
) -> None:
    turns: list[tuple[int, int]] = []
    paired = await bench_paired_cycles(
        cluster, clients=(2,), seconds=0.3, turns=3, on_turn=lambda n, t: turns.append((n, t))
    )
    assert turns == [(2, 0), (2, 1), (2, 2)]
    pair = paired[2]
    assert len(pair["ratios"]) == 3 and pair["ratio"] == sorted(pair["ratios"])[1]
    assert pair["master"]["cycles_per_s"] > 10 and pair["shards"]["cycles_per_s"] > 10
    assert pair["shards"]["requests_per_commit"] >= 1  # the replica's, written behind
    assert "requests_per_commit" not in pair["master"]
    # DLRover's client makes a cycle of two requests (done, then fetch); AntDT's of one.
    assert 1.9 < pair["dlrover"]["requests_per_cycle"] < 2.2
    assert 0.9 < pair["master"]["requests_per_cycle"] < 1.2
    assert len(pair["dlrover_ratios"]) == 3
    assert pair["dlrover_ratio"] == sorted(pair["dlrover_ratios"])[1]
    # Raw NATS reports its CPU per request, every process together.
    raw = await bench_raw_nats_request(
        cluster.nats.url, seconds=0.3, clients=2, nats_pid=cluster.nats.pid
    )
    assert raw["responder_cpu_us_per_cycle"] > 0 and raw["nats_cpu_us_per_cycle"] > 0
    assert cpu_per_cycle(raw) > raw["client_cpu_us_per_cycle"]


async def test_the_write_budget_bounds_what_a_job_writes_into_etcd(
    cluster: EmbeddedCluster,
) -> None:
    """A replica process under a small budget writes at most about that much, and less
    than the same load unpaced, while answering every request."""
    load = {"ranks": 40, "every_s": 0.1, "seconds": 1.5}
    unpaced = await bench_ledger_writes(cluster, budget=0.0, **load)  # type: ignore[arg-type]
    budget = 20_000.0
    paced = await bench_ledger_writes(
        cluster,
        budget=budget,
        burst_s=0.0,
        **load,  # type: ignore[arg-type]
    )
    for figures in (unpaced, paced):
        assert figures["requests_per_s"] > 100  # every rank kept being answered
    # Each write waits its own bytes / budget: one write's worth of slack at the start.
    assert 0 < paced["written_bytes_per_s"] <= budget * 1.2
    assert unpaced["written_bytes_per_s"] > 2 * paced["written_bytes_per_s"]
    assert paced["requests_per_commit"] > 2 * unpaced["requests_per_commit"]
    assert paced["budget_waits"] > 0 and unpaced["budget_waits"] == 0


async def test_the_epoch_turn_bench_turns_every_rank_and_telling_them_asks_less(
    cluster: EmbeddedCluster,
) -> None:
    told = await bench_epoch_turn(cluster, ranks=64, hold_s=0.6, told=True)
    polled = await bench_epoch_turn(cluster, ranks=64, hold_s=0.6, told=False)
    for figures in (told, polled):  # every waiting rank got a grant of the next epoch
        assert 0 < figures["turn_p50_ms"] <= figures["turn_max_ms"] < 30_000
    # 63 ranks at 0.05 s ask about 1,260 times a second; told, each about once in 0.6 s
    # (their fallback poll is 0.32 s: 64 ranks / 200 polls a second).
    assert told["waiting_requests_per_s"] < polled["waiting_requests_per_s"] / 2
