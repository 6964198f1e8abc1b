"""The etcd seam and job ownership against a real etcd."""

from __future__ import annotations

import asyncio

import pytest

from antdt.runtime.config import EtcdSettings
from antdt.runtime.coordination.ownership import Ownership
from antdt.runtime.servers import EmbeddedEtcd
from antdt.runtime.store import (
    Compare,
    Delete,
    Get,
    Put,
    Store,
    StoreUnavailable,
    Versioned,
    WatchEvent,
    retrying,
)
from antdt.schemas import JobSpec, Keys
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


async def test_get_put_models_and_prefix(store: Store) -> None:
    spec = JobSpec(job="j1", world_size=2, dataset_size=100, shard_size=10, global_batch=8)
    key = store.key("jobs/j1/spec")
    await store.put(key, spec.model_dump_json().encode())
    loaded = await store.get_model(key, JobSpec)
    assert loaded is not None and loaded[0] == spec and loaded[1] > 0
    await store.put(store.key("jobs/j2/spec"), b"{}")
    keys = [v.key for v in await store.get_prefix(store.key("jobs/"), keys_only=True)]
    assert keys == [store.key("jobs/j1/spec"), store.key("jobs/j2/spec")]
    assert await store.get(store.key("missing")) is None


async def test_compare_and_swap_and_multi_key_txn(store: Store) -> None:
    key = store.key("plan")
    assert await store.cas(key, b"v1", 0)  # create only if absent
    assert not await store.cas(key, b"again", 0)
    current = await store.get(key)
    assert current is not None
    assert await store.cas(key, b"v2", current.mod_revision)
    assert not await store.cas(key, b"v3", current.mod_revision)  # stale revision
    got = await store.get(key)
    assert got is not None and got.value == b"v2"
    # both keys or neither, and a read in the same transaction
    other = store.key("other")
    result = await store.txn(
        [Compare.mod_is(key, got.mod_revision)], [Put(other, b"x"), Delete(key), Get(other)]
    )
    assert result.succeeded and result.gets[0] is not None and result.gets[0].value == b"x"
    assert await store.get(key) is None
    failed = await store.txn([Compare.absent(other)], [Put(key, b"no")], [Get(other)])
    assert not failed.succeeded and failed.gets[0] is not None
    assert await store.get(key) is None


async def test_lease_keys_vanish_on_revoke_and_on_expiry(store: Store) -> None:
    lease = await store.grant_lease(2)
    await store.put(store.key("leased"), b"1", lease=lease)
    await asyncio.wait_for(asyncio.shield(asyncio.sleep(0)), 1)
    await lease.revoke()
    assert lease.lost.is_set()
    assert await store.get(store.key("leased")) is None


async def test_ownership_exclusive_and_takeover(store: Store, settings) -> None:  # type: ignore[no-untyped-def]
    keys = Keys(settings.etcd.key_prefix)
    other_store = await Store(settings.etcd).connect()
    first = Ownership(store, keys, service="monitor", replica_id="a", ttl_s=2)
    second = Ownership(other_store, keys, service="monitor", replica_id="b", ttl_s=2)
    assert await first.try_acquire("job")
    assert not await second.try_acquire("job")
    assert await first.try_acquire("job")  # idempotent
    assert await second.owner_of("job") == "a"
    # the fence holds for the owner only
    fence_ok = await store.txn([first.fence("job")], [Put(store.key("fenced"), b"1")])
    assert fence_ok.succeeded
    fence_bad = await store.txn([second.fence("job")], [Put(store.key("fenced"), b"2")])
    assert not fence_bad.succeeded
    await first.stop()  # revoke: the key goes at once
    assert not first.owns("job")
    assert await wait_for(lambda: second.try_acquire("job"), timeout=5, what="takeover")
    await second.stop()
    await other_store.close()


async def test_ownership_dropped_when_lease_expires(tmp_path, unique) -> None:  # type: ignore[no-untyped-def]
    """etcd goes away for longer than the TTL: the owner stops acting at once."""
    etcd = EmbeddedEtcd(tmp_path / "e").start()
    store = await Store(EtcdSettings(endpoint=etcd.endpoint, timeout_s=1)).connect()
    owner = Ownership(store, Keys(f"/{unique}/"), service="controller", replica_id="x", ttl_s=2)
    lost: list[str] = []

    async def on_lost(job: str) -> None:
        lost.append(job)

    owner.on_lost(on_lost)
    assert await owner.try_acquire("job")
    watcher = asyncio.create_task(owner.watch_lease())
    etcd.kill()
    await wait_for(lambda: lost == ["job"], timeout=10, what="ownership dropped")
    assert not owner.owns("job")
    etcd.start()
    assert await wait_for(lambda: _acquire(owner), timeout=20, what="re-acquired after restart")
    watcher.cancel()
    await owner.stop()
    await store.close()
    etcd.stop()


async def _acquire(owner: Ownership) -> bool:
    try:
        return await owner.try_acquire("job")
    except Exception:
        return False


async def test_watch_resumes_after_etcd_restart(tmp_path, unique) -> None:  # type: ignore[no-untyped-def]
    etcd = EmbeddedEtcd(tmp_path / "e").start()
    store = await Store(EtcdSettings(endpoint=etcd.endpoint, timeout_s=1)).connect()
    seen: list[WatchEvent] = []

    async def consume() -> None:
        async for event in store.watch_prefix(f"/{unique}/", retry_s=0.1):
            seen.append(event)

    task = asyncio.create_task(consume())
    await wait_for(lambda: _put_and_seen(store, f"/{unique}/a", seen), what="first event")
    etcd.kill()
    etcd.start()
    await retrying(lambda: store.put(f"/{unique}/b", b"2"))
    await wait_for(lambda: any(e.key.endswith("/b") for e in seen), timeout=20, what="resume")
    keys = [e.key for e in seen]
    assert len(keys) == len(set(zip(keys, (e.mod_revision for e in seen), strict=True)))
    task.cancel()
    await store.close()
    etcd.stop()


async def _put_and_seen(store: Store, key: str, seen: list[WatchEvent]) -> bool:
    if not seen:
        await store.put(key, b"1")
        await asyncio.sleep(0.05)
    return bool(seen)


async def test_etcd_away_is_a_store_error_not_the_clients(tmp_path, unique) -> None:  # type: ignore[no-untyped-def]
    """Callers see StoreUnavailable (retryable) from every call, never an aetcd type."""
    etcd = EmbeddedEtcd(tmp_path / "e").start()
    store = await Store(EtcdSettings(endpoint=etcd.endpoint, timeout_s=1)).connect()
    await store.put(f"/{unique}/a", b"1")
    etcd.kill()
    calls = [
        lambda: store.get(f"/{unique}/a"),
        lambda: store.put(f"/{unique}/a", b"2"),
        lambda: store.txn([], [Put(f"/{unique}/a", b"3")]),
        store.current_revision,
        lambda: store.get_prefix(f"/{unique}/"),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailable) as raised:
            await call()
        assert type(raised.value.__cause__).__module__.startswith("aetcd")
    etcd.start()
    assert (await retrying(lambda: store.get(f"/{unique}/a"))).value == b"1"
    await store.close()
    etcd.stop()


class _CompactedBetween(Store):
    """A store whose first prefix read is followed, before the watch starts, by changes
    and a compaction of etcd's history past them: as if the watch had been away longer
    than etcd keeps history."""

    reads = 0

    async def get_prefix(self, prefix: str) -> list[Versioned]:
        items = await super().get_prefix(prefix)
        self.reads += 1
        if self.reads == 1:
            await self.delete(f"{prefix}a")
            await self.put(f"{prefix}c", b"3")
            await self.compact(await self.current_revision())
        return items


async def test_follow_reads_again_when_its_watch_falls_behind_compaction(tmp_path, unique) -> None:  # type: ignore[no-untyped-def]
    etcd = EmbeddedEtcd(tmp_path / "e").start()  # its own: compaction is etcd-wide
    prefix = f"/{unique}/"
    store = await _CompactedBetween(EtcdSettings(endpoint=etcd.endpoint)).connect()
    await store.put(f"{prefix}a", b"1")
    await store.put(f"{prefix}b", b"2")
    mirror: dict[str, bytes] = {}

    async def follow() -> None:
        async for event in store.follow_prefix(prefix, retry_s=0.1):
            if event.kind == "put":
                mirror[event.key] = event.value
            else:
                mirror.pop(event.key, None)

    task = asyncio.create_task(follow())
    try:
        await wait_for(lambda: store.reads >= 2, what="the prefix read again")
        await wait_for(lambda: set(mirror) == {f"{prefix}b", f"{prefix}c"}, what="the mirror")
        await store.put(f"{prefix}d", b"4")  # and the watch goes on after the read
        await wait_for(lambda: f"{prefix}d" in mirror, what="a change after the read")
        assert mirror == {f"{prefix}b": b"2", f"{prefix}c": b"3", f"{prefix}d": b"4"}
    finally:
        task.cancel()
        await store.close()
        etcd.stop()


async def test_a_prefix_read_past_grpcs_default_reply_size_is_read_whole(store: Store) -> None:
    """A claim round reads every key under `jobs/` (a 100,000-rank job's hellos are over
    4 MiB of keys alone): a reply past gRPC's 4 MiB default must still come back."""
    prefix = store.key("big/")
    names = [f"{prefix}{n:05d}-{'k' * 1000}" for n in range(5000)]  # ~5 MB of keys
    for at in range(0, len(names), 100):
        await store.txn([], [Put(name, b"") for name in names[at : at + 100]])
    try:
        found = await store.get_prefix(prefix, keys_only=True)
        assert [f.key for f in found] == names
    finally:
        await store.delete_prefix(prefix)
