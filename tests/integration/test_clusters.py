"""Three-node NATS (JetStream, R3 streams) and etcd clusters on loopback, one node of
each killed -9 mid-run: the clients, given every member, carry on and lose nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from antdt.runtime.bus import Bus, StreamUnanswered
from antdt.runtime.store import Store
from antdt.schemas import INCIDENT_STREAM, Subjects
from antdt.schemas.events import Incident
from tests.clusters import Clusters, retry, running_clusters

pytestmark = [pytest.mark.integration, pytest.mark.slow]

S = Subjects("antdt.cl")


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[Clusters]:
    with running_clusters(tmp_path) as running:
        yield running


def _incident(n: int) -> Incident:
    return Incident(
        id=f"i{n}",
        job="job",
        rank=0,
        host="h",
        kind="slow",
        state="opened",
        step=n,
        opened_at=1.0,
        updated_at=1.0,
        ratio=2.0,
        windows=1,
    )


async def test_one_node_of_each_cluster_killed_and_nothing_is_lost(clusters: Clusters) -> None:
    nats, etcd = clusters.nats, clusters.etcd
    bus = Bus(clusters.nats_settings("antdt.cl"), name="r3")
    store = Store(clusters.etcd_settings("/antdt-cl/"))
    await bus.connect(retry_for_s=20)
    await store.connect(retry_for_s=20)
    try:
        for attempt in range(50):  # the JetStream meta leader is elected after start
            try:
                await bus.jetstream.ensure_stream(INCIDENT_STREAM, [S.any_job("incident")])
                break
            except Exception:
                if attempt == 49:
                    raise
                await asyncio.sleep(0.2)
        info = await bus.nc.jetstream().stream_info(INCIDENT_STREAM)
        assert info.config.num_replicas == 3
        for n in range(10):
            # The R3 stream's own group elects its leader after the stream is made: until
            # then a publish finds no responder (msg_id makes a retried one land once).
            await retry(
                lambda n=n: bus.jetstream.publish(
                    S.incident("job"), _incident(n), msg_id=f"i{n}", timeout=2
                )
            )
            await store.put(store.key(f"k{n}"), str(n).encode())
        used = bus.nc.connected_url
        assert used is not None
        next(node for node in nats if node.port == used.port).kill()  # the one in use
        etcd[0].kill()  # the first endpoint: the one gRPC's pick_first uses
        for n in range(10, 20):
            await retry(
                lambda n=n: bus.jetstream.publish(
                    S.incident("job"), _incident(n), msg_id=f"i{n}", timeout=2
                )
            )
            await retry(lambda n=n: store.put(store.key(f"k{n}"), str(n).encode()))
        replay = await retry(
            lambda: bus.jetstream.read(INCIDENT_STREAM, S.incident("job"), Incident)
        )
        assert [i.step for i in replay.items] == list(range(20))
        kept = await retry(lambda: store.get_prefix(store.key("k")))
        assert sorted(int(v.value) for v in kept) == list(range(20))
    finally:
        await bus.close()
        await store.close()


async def test_a_publish_to_a_stream_without_a_leader_is_unanswered_not_missing(
    clusters: Clusters,
) -> None:
    """Two of three NATS nodes killed: the R3 stream has no quorum, so no leader answers
    its publishes. The bus says so (worth trying again), not that the stream is gone."""
    bus = Bus(clusters.nats_settings("antdt.cu"), name="r3")
    await bus.connect(retry_for_s=20)
    subjects = Subjects("antdt.cu")
    try:
        await retry(lambda: bus.jetstream.ensure_stream("CU", [subjects.any_job("incident")]))
        await retry(
            lambda: bus.jetstream.publish(subjects.incident("job"), _incident(0), msg_id="i0")
        )
        used = bus.nc.connected_url
        assert used is not None
        for node in [node for node in clusters.nats if node.port != used.port]:
            node.kill()
        with pytest.raises(StreamUnanswered):
            await bus.jetstream.publish(subjects.incident("job"), _incident(1), timeout=2)
    finally:
        await bus.close()
