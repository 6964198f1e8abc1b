"""The turn of an epoch in a large job: every rank but one waits for the next epoch while
the last one finishes the epoch's last shard. Driven both ways in one run: the waiting
ranks told (the announcement, `retry_after_s`), and polling every OLD_POLL_S as agents
did before."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import EtcdSettings
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store
from antdt.schemas import EpochFinished, FetchStatus, JobSpec, ShardFetch, ShardReply
from bench.display import console
from bench.replicas import ShardsReplicas
from bench.shards import percentiles

#: The waiting ranks' poll before the announcement existed, seconds.
OLD_POLL_S = 0.05
#: NATS connections the simulated ranks share (each subscribes to the announcement).
CONNECTIONS = 8


async def bench_epoch_turn(
    cluster: EmbeddedCluster, *, ranks: int, hold_s: float, told: bool
) -> dict[str, float]:
    """A 2-epoch job of `ranks` ranks, one shard each: all but rank 0 report done, settle
    epoch 0 and ask for epoch 1; rank 0 reports `hold_s` later. `told`: waiting ranks ask
    again on the announcement or at `retry_after_s`, else every OLD_POLL_S. Figures: the
    requests a second the replica answered meanwhile, and the time from rank 0's last done
    report to each waiting rank's first grant of epoch 1."""
    store = await Store(EtcdSettings(endpoint=cluster.etcd.endpoint)).connect()
    job = f"turn{ranks}{'told' if told else 'polled'}"
    try:
        async with ShardsReplicas(cluster, count=1) as replica:
            spec = JobSpec(
                job=job,
                world_size=ranks,
                dataset_size=ranks * 100,
                shard_size=100,
                global_batch=ranks * 32,
                epochs=2,
            )
            await replica.register(store, spec)
            buses = [
                await Bus(replica.nats, name=f"bench-turn-{n}").connect()
                for n in range(CONNECTIONS)
            ]
            try:
                return await _turn(replica, buses, job, ranks, hold_s, told)
            finally:
                for bus in buses:
                    await bus.close()
    finally:
        await store.close()


async def _turn(
    replica: ShardsReplicas, buses: list[Bus], job: str, ranks: int, hold_s: float, told: bool
) -> dict[str, float]:
    subject = replica.subjects.shards(job, "fetch")
    news = [asyncio.Event() for _ in buses]
    for bus, event in zip(buses, news, strict=True):

        async def on_news(_: EpochFinished, __: Delivery, event: asyncio.Event = event) -> None:
            event.set()

        await bus.subscribe(replica.subjects.epoch_finished(job), EpochFinished, on_news)

    async def ask(
        rank: int, epoch: int, done: tuple[Any, ...] = (), settle: bool = False
    ) -> ShardReply:
        request = ShardFetch(
            job=job, rank=rank, epoch=epoch, done=done, want=int(not settle), held=(), settle=settle
        )
        return await buses[rank % len(buses)].request(subject, request, ShardReply, timeout=60)

    held = {rank: (await ask(rank, 0)).grants for rank in range(ranks)}
    waiting_requests, turned = [0], {}
    last_done_sent = asyncio.get_running_loop().create_future()

    async def wait_for_epoch_1(rank: int) -> None:
        event = news[rank % len(buses)]
        await ask(rank, 0, tuple(g.ref() for g in held[rank]))  # out of epoch 0
        while True:
            event.clear()
            reply = await ask(rank, 0, settle=True)
            waiting_requests[0] += 1
            if not reply.outstanding:  # every shard of epoch 0 done: on to epoch 1
                reply = await ask(rank, 1)
                if reply.status is not FetchStatus.OK or not reply.grants:
                    raise RuntimeError(f"rank {rank}: epoch 1 answered {reply.status.value}")
                turned[rank] = time.perf_counter() - await last_done_sent
                return
            if told:  # the announcement, or the reply's poll
                with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), max(reply.retry_after_s, OLD_POLL_S))
            else:
                await asyncio.sleep(OLD_POLL_S)

    await replica.go()
    started = time.perf_counter()
    waiting = asyncio.gather(*(wait_for_epoch_1(rank) for rank in range(1, ranks)))
    await asyncio.sleep(hold_s)
    asked_while_waiting, held_for = waiting_requests[0], time.perf_counter() - started
    served = (await replica.counters())["committed"]
    last_done_sent.set_result(time.perf_counter())
    await ask(0, 0, tuple(g.ref() for g in held[0]))
    await waiting
    counters = await replica.counters()
    turn = percentiles(list(turned.values()))
    return {
        "waiting_requests_per_s": asked_while_waiting / held_for,
        "served_per_s": served / held_for,
        "turn_p50_ms": turn["p50_ms"],
        "turn_p99_ms": turn["p99_ms"],
        "turn_max_ms": max(turned.values()) * 1000,
        "service_cpu_share": counters["cpu_s"] / (time.perf_counter() - started),
    }


async def epoch_turn_row(cluster: EmbeddedCluster, *, ranks: int = 1024) -> dict[str, Any]:
    """The turn with the announcement, against the same turn polled every 0.05 s."""
    results = {}
    for told in (False, True):
        name = "told" if told else "polled"
        with console.status(f"epoch turn, {ranks:,} ranks waiting for the last shard, {name}"):
            results[name] = await bench_epoch_turn(cluster, ranks=ranks, hold_s=3.0, told=told)
    told_, polled = results["told"], results["polled"]
    console.print(
        f"epoch turn, {ranks:,} ranks waiting 3 s for the last shard: the replica served "
        f"{told_['served_per_s']:,.0f} requests/s (CPU {told_['service_cpu_share']:.0%}) with "
        f"the announcement, {polled['served_per_s']:,.0f}/s (CPU "
        f"{polled['service_cpu_share']:.0%}) polled every 0.05 s; every rank in the next "
        f"epoch {told_['turn_max_ms']:.0f} ms after the last done (p50 "
        f"{told_['turn_p50_ms']:.0f} ms), polled {polled['turn_max_ms']:.0f} ms"
    )
    return {
        "what": f"epoch turn, {ranks:,} ranks waiting 3 s for the last shard: requests/s "
        "served while they wait",
        "value": told_["served_per_s"],
        "p50_ms": told_["turn_p50_ms"],
        "p99_ms": told_["turn_p99_ms"],
        "baseline": polled["served_per_s"],
        "baseline_what": "same turn, ranks polling every 0.05 s",
        # The turn itself is the time to serve every waiting rank once, either way.
        "target": "ratio <= 0.2 (told, not polled); turn reported",
        "details": results,
    }
