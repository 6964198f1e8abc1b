"""Ledgers of large jobs against the real etcd and a real shards replica: a checkpoint of
10^4 ranks is written and read back within etcd's request limit, a ledger that would
outgrow the limit is refused with a clear error, nothing written, the replica serving on,
and the status of a large job stays within a message."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from antdt.runtime.bus import Bus, RequestRefused
from antdt.runtime.config import ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.store import Store
from antdt.schemas import (
    MAX_MESSAGE_BYTES,
    CommitReply,
    FetchStatus,
    Keys,
    RestoreReply,
    ShardCommit,
    ShardFetch,
    ShardReply,
    ShardRestore,
    ShardStatus,
    ShardStatusRequest,
    Subjects,
)
from antdt.schemas.shards import STATUS_LISTED_MAX
from antdt.services.runner import start_service
from antdt.services.shards.change import Writes
from antdt.services.shards.checkpoints import apply_commit
from antdt.services.shards.ops import to_change
from antdt.services.shards.service import ShardsService, ShardsSettings
from antdt.services.shards.state import LedgerState, PendingCheckpoint, RankCommit
from antdt.services.shards.state import status as ledger_status
from antdt.services.shards.stored import EtcdLedgers, Revision, Snapshot
from tests.integration.agent_fixtures import shard_status
from tests.integration.test_shards_checkpoints import render
from tests.integration.test_shards_concurrency import register
from tests.unit.test_ledger_columns import ETCD_MAX_REQUEST, big_job, older_format

pytestmark = pytest.mark.integration


async def test_a_checkpoint_of_ten_thousand_ranks_is_written_to_real_etcd(
    settings: ServiceSettings, store: Store
) -> None:
    """All ranks but one committed, then the last: both writes (the second with the
    snapshot in the same transaction) pass etcd's default request limit, and read back."""
    ranks, keys = 10_000, Keys(settings.etcd.key_prefix)
    ledgers = EtcdLedgers(store, keys)
    steady = big_job(ranks)
    commits = tuple(
        RankCommit(rank=r, held=steady.in_flight[2 * r : 2 * r + 2])  # big_job's order
        for r in range(ranks - 1)
    )
    pending = steady.model_copy(
        update={"pending": PendingCheckpoint(step=7, epoch=0, commits=commits)}
    )
    pending = LedgerState.model_validate(pending.model_dump())
    assert len(older_format(pending)) > ETCD_MAX_REQUEST  # what could not be written
    first = await ledgers.commit("big", Snapshot(steady, Revision(0, 0)), pending, Writes())
    assert first.ok and first.snapshot is not None
    out = apply_commit(pending, ShardCommit(job="big", rank=ranks - 1, step=7, epoch=0))
    writes = Writes()
    writes.add(to_change(out, keys, "big"))
    second = await ledgers.commit("big", first.snapshot, out.state, writes)
    assert second.ok
    loaded = await ledgers.load("big")
    assert loaded.state == out.state and loaded.state.checkpoints == (7,)
    snapshot = await store.get_model(keys.ledger_checkpoint("big", 7), LedgerState)
    assert snapshot is not None and len(snapshot[0].in_flight) == 2 * ranks


async def test_a_ledger_past_the_transaction_limit_is_refused_and_nothing_is_written(
    settings: ServiceSettings, store: Store
) -> None:
    job, world = "outgrown", 400
    await register(store, settings, job, world=world, shards=10_000, epochs=1)
    await register(store, settings, "neighbour", world=1, shards=10, epochs=1)
    runtime = ServiceRuntime("small-txn")
    replica_settings = ShardsSettings(
        **{**settings.model_dump(), "replica_id": "small", "max_txn_bytes": 10_000}
    )
    service: ShardsService = await start_service("shards", replica_settings, runtime)
    bus = await Bus(settings.nats, name="ranks").connect()
    subjects = Subjects(settings.nats.subject_prefix)
    fetch, status = subjects.shards(job, "fetch"), subjects.shards(job, "status")
    try:
        refused, before, asked = None, None, 0
        with capture_logs() as logs:
            for rank in range(world):  # each rank takes two shards: the ledger grows
                before = await bus.request(status, ShardStatusRequest(job=job), ShardStatus)
                try:
                    await bus.request(
                        fetch, ShardFetch(job=job, rank=rank, epoch=0, want=2), ShardReply
                    )
                    asked += 1
                except RequestRefused as exc:
                    refused = exc
                    break
        assert refused is not None, "the ledger never reached max_txn_bytes"
        assert refused.reply.code == "too_large" and "max_txn_bytes" in refused.reply.error
        assert 100 < asked < world
        after = await bus.request(status, ShardStatusRequest(job=job), ShardStatus)
        assert after == before  # nothing written
        assert any(e["event"] == "ledger commit refused" and e["code"] == "too_large" for e in logs)
        # The replica serves on: the same job's done marks shrink it, and other jobs.
        neighbour = ShardFetch(job="neighbour", rank=0, epoch=0)
        other = await bus.request(subjects.shards("neighbour", "fetch"), neighbour, ShardReply)
        assert other.status is FetchStatus.OK
        counts = service.bus.rejections.counts
        assert sum(n for (_, code), n in counts.items() if code == "too_large") >= 1
    finally:
        await bus.close()
        await runtime.shutdown()


async def test_status_of_a_large_job_lists_a_bounded_part_and_counts_the_rest(
    settings: ServiceSettings, store: Store, bus: Bus
) -> None:
    """A ShardStatus listing every in-flight shard of a 10^4-rank job was 1.4 MB, past
    nats-server's payload limit: `antdt shards status` got no answer. It lists at most
    the request's limit, lowest ranks first, or the ranks asked for, and counts them all."""
    job, world, held = "wide", 300, 8
    await register(store, settings, job, world=world, shards=10_000, epochs=1)
    runtime = ServiceRuntime("status")
    await start_service("shards", ShardsSettings(**settings.model_dump()), runtime)
    subjects = Subjects(settings.nats.subject_prefix)
    try:
        fetch = subjects.shards(job, "fetch")
        await asyncio.gather(
            *(
                bus.request(fetch, ShardFetch(job=job, rank=r, epoch=0, want=held), ShardReply)
                for r in range(world)
            )
        )
        ask = subjects.shards(job, "status")
        default = await bus.request(ask, ShardStatusRequest(job=job), ShardStatus)
        assert default.in_flight_total == world * held and len(default.in_flight) == 2000
        assert [e.rank for e in default.in_flight] == sorted(e.rank for e in default.in_flight)
        assert "2,000 of 2,400 listed" in render(default)
        some = await bus.request(ask, ShardStatusRequest(job=job, ranks=(7, 299)), ShardStatus)
        assert sorted({e.rank for e in some.in_flight}) == [7, 299]
        assert len(some.in_flight) == 2 * held and some.in_flight_total == world * held
    finally:
        await runtime.shutdown()


def test_the_status_of_ten_thousand_ranks_fits_a_message() -> None:
    job = big_job(10_000)
    wide = tuple(  # the widest numbers a 10^4-rank job's entries can have
        e.model_copy(update={"shard": 99_990 + i, "rank": 9_999, "position": 9_999})
        for i, e in enumerate(job.in_flight[:10])
    )
    job = job.model_copy(update={"in_flight": wide + job.in_flight[10:]})
    status = ledger_status(job, ranks=(), limit=STATUS_LISTED_MAX)
    assert status.in_flight_total == 20_000 and len(status.in_flight) == STATUS_LISTED_MAX
    per_entry = max(len(e.model_dump_json()) for e in status.in_flight)
    assert per_entry * STATUS_LISTED_MAX + 1000 < MAX_MESSAGE_BYTES
    assert len(status.model_dump_json()) < MAX_MESSAGE_BYTES


async def test_every_rank_of_a_restart_restores_with_one_read_of_the_snapshot(
    settings: ServiceSettings, store: Store, bus: Bus
) -> None:
    """A restarted job's ranks all restore the same checkpoint at once. Each request read
    and decoded the snapshot, one request at a time: 20 s for 1,000 ranks. They now share
    one read; the first restores, every other is answered from the ledger."""
    job, world = "restarted", 300
    await register(store, settings, job, world=world, shards=10_000, epochs=1)
    runtime = ServiceRuntime("restores")
    service: ShardsService = await start_service(
        "shards", ShardsSettings(**settings.model_dump()), runtime
    )
    subjects = Subjects(settings.nats.subject_prefix)
    try:
        fetch, commit = subjects.shards(job, "fetch"), subjects.shards(job, "commit")
        await asyncio.gather(
            *(
                bus.request(fetch, ShardFetch(job=job, rank=r, epoch=0, want=2), ShardReply)
                for r in range(world)
            )
        )
        commits = await asyncio.gather(
            *(
                bus.request(commit, ShardCommit(job=job, rank=r, step=5, epoch=0), CommitReply)
                for r in range(world)
            )
        )
        assert sum(c.completed_now for c in commits) == 1
        restore = subjects.shards(job, "restore")
        replies = await asyncio.gather(
            *(
                bus.request(
                    restore,
                    ShardRestore(job=job, rank=r, token="again", step=5),
                    RestoreReply,
                    timeout=10,
                )
                for r in range(world)
            )
        )
        assert sum(r.restored for r in replies) == 1
        assert {(r.incarnation, r.step) for r in replies} == {(1, 5)}
        assert service.restores.reads <= 2  # the job's spec and the snapshot, once each
        late = await bus.request(  # a rank retrying, after the restore: from the ledger
            restore, ShardRestore(job=job, rank=0, token="again", step=5), RestoreReply
        )
        assert (late.incarnation, late.restored) == (1, False)
        assert service.restores.reads <= 2
        ledger = await shard_status(bus, job)
        assert ledger.incarnation == 1 and ledger.in_flight_total == world * 2
    finally:
        await runtime.shutdown()
