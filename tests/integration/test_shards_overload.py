"""A shards replica flooded with requests, real nats-server and etcd: what waits for a
handler is bounded (request_backlog), what is past it is dropped and counted as refused
(slow_consumer), the replica goes on serving, and every shard is still done exactly once.
Before the bound a replica queued up to 500,000 requests per subject."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store
from antdt.schemas import ErrorCode, ShardFetch, Subjects
from antdt.services.runner import start_service
from antdt.services.shards.service import ShardsService, ShardsSettings
from tests.conftest import settings_on
from tests.integration.test_shards_concurrency import Fleet, register

pytestmark = pytest.mark.integration

BACKLOG = 20  # requests per subject
FLOOD = 4000


@pytest.fixture
async def own_servers(tmp_path: Path, unique: str) -> AsyncIterator[tuple[ServiceSettings, Store]]:
    """Servers of its own: in the whole suite, on the session's, the flooded replica's
    lease grants were refused ("invalid auth token"), which it never was alone."""
    with EmbeddedCluster(root=tmp_path / "servers") as cluster:
        settings = settings_on(cluster, unique)
        store = await Store(settings.etcd).connect()
        try:
            yield settings, store
        finally:
            await store.close()


async def test_a_flooded_replica_drops_counts_and_still_grants_each_shard_once(
    own_servers: tuple[ServiceSettings, Store],
) -> None:
    settings, store = own_servers
    world, shards, job = 4, 120, "flood"
    await register(store, settings, job, world=world, shards=shards, epochs=1)
    runtime = ServiceRuntime("flooded")
    config = {**settings.model_dump(), "replica_id": "flooded", "request_backlog": BACKLOG}
    service: ShardsService = await start_service("shards", ShardsSettings(**config), runtime)
    subjects = Subjects(settings.nats.subject_prefix)
    subject = subjects.shards(job, "fetch")
    flood = await Bus(settings.nats, name="flood").connect()
    bus = await Bus(settings.nats, name="ranks").connect()
    fleet = Fleet(job, world)
    try:
        requests = [
            ShardFetch(job=job, rank=r, epoch=0, want=1).model_dump_json().encode()
            for r in range(world)
        ]
        for n in range(FLOOD):  # no reply subject: nobody waits for these
            await flood.publish_raw(subject, requests[n % world])
        await flood.flush(timeout=10)
        counts = service.bus.rejections.counts
        pattern = subjects.any_job("shards.fetch")
        await asyncio.sleep(0.5)
        dropped = counts[(pattern, ErrorCode.SLOW_CONSUMER)]
        assert dropped > 0, dict(counts)

        async def rank_loop(rank: int) -> None:  # the ranks learn what the flood took
            while rank not in fleet.finished:
                held = len(fleet.held.get(rank, ()))
                sent = fleet.request(rank, want=1, report=held)
                if wait := await fleet.send(bus, subject, rank, sent):
                    await asyncio.sleep(wait)

        await asyncio.wait_for(asyncio.gather(*(rank_loop(r) for r in range(world))), 60)
    finally:
        await flood.close()
        await bus.close()
        await runtime.shutdown()
    fleet.check_complete(shards, 1)
    assert service.requests["fetch"] + dropped >= FLOOD  # each handled or counted
