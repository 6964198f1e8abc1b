"""Ownership while etcd goes away, against a private etcd this module stops and starts:
the lease is taken again rather than the service failing, a release that cannot delete
leaves the job ours (not nobody's), a claim answered after its lease lapsed is not
taken, and a lease whose refreshes hang counts as lost no later than its TTL."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from antdt.runtime.config import EtcdSettings
from antdt.runtime.coordination.ownership import Ownership
from antdt.runtime.servers import EmbeddedEtcd
from antdt.runtime.store import Store, StoreError
from antdt.schemas import Keys
from tests.helpers import wait_for

pytestmark = pytest.mark.integration

KEYS = Keys("/away/")


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEtcd]:
    server = EmbeddedEtcd(tmp_path_factory.mktemp("etcd-away")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def stores(etcd: EmbeddedEtcd) -> AsyncIterator[tuple[Store, Store]]:
    settings = EtcdSettings(endpoint=etcd.endpoint, timeout_s=1.0, key_prefix=KEYS.prefix)
    a, b = await Store(settings).connect(), await Store(settings).connect()
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


def _owners(stores: tuple[Store, Store], ttl_s: int) -> tuple[Ownership, Ownership]:
    a, b = stores
    return (
        Ownership(a, KEYS, service="monitor", replica_id="a", ttl_s=ttl_s),
        Ownership(b, KEYS, service="monitor", replica_id="b", ttl_s=ttl_s),
    )


@contextlib.asynccontextmanager
async def _away(etcd: EmbeddedEtcd) -> AsyncIterator[None]:
    """etcd stopped for the block, started again after it whatever happened."""
    etcd.stop()
    try:
        yield
    finally:
        await asyncio.to_thread(etcd.start)


async def test_the_lease_watch_outlives_an_outage_longer_than_the_ttl(
    etcd: EmbeddedEtcd, stores: tuple[Store, Store], unique: str
) -> None:
    a, _ = _owners(stores, ttl_s=2)
    watch = asyncio.create_task(a.watch_lease())
    job = f"outage-{unique}"
    try:
        assert await a.try_acquire(job)
        async with _away(etcd):
            await asyncio.sleep(3.5)  # past the TTL: the lease lapses
        assert not watch.done(), watch  # etcd away made no task fail
        assert not a.owns(job)
        await wait_for(lambda: _leased(a), timeout=15, what="a new lease")
        assert await a.replicas() == ["a"]  # listed again, with the new lease
        # etcd gives its leases a full TTL again as it restarts: the old key goes then
        await wait_for(lambda: a.try_acquire(job), timeout=10, what="the job claimed again")
        assert not watch.done()
    finally:
        watch.cancel()
        await a.stop()


async def _leased(owner: Ownership) -> bool:
    lease = owner._lease
    return lease is not None and not lease.lost.is_set()


async def test_a_release_that_cannot_delete_is_tried_again_and_never_owned_twice(
    etcd: EmbeddedEtcd, stores: tuple[Store, Store], unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete that fails leaves the key bound to our live lease: it is deleted later,
    not left to keep every replica from the job. And a failed delete may have been
    applied: the job is never taken for ours again, or two replicas would own it."""
    a, b = _owners(stores, ttl_s=5)
    watch = asyncio.create_task(a.watch_lease())
    job, applied = f"release-{unique}", f"applied-{unique}"
    try:
        assert await a.try_acquire(job)
        async with _away(etcd):
            with pytest.raises(StoreError):
                await a.release(job)
            assert not a.owns(job)
        await wait_for(lambda: b.try_acquire(job), timeout=15, what="b claims it once deleted")
        assert not a.owns(job)

        assert await a.try_acquire(applied)
        store, real_txn = stores[0], stores[0].txn

        async def applied_then_failed(*args: Any, **kwargs: Any) -> Any:
            await real_txn(*args, **kwargs)
            raise StoreError("the reply lost after the delete was applied")

        monkeypatch.setattr(store, "txn", applied_then_failed)
        with pytest.raises(StoreError):
            await a.release(applied)
        monkeypatch.setattr(store, "txn", real_txn)
        assert await b.try_acquire(applied)
        await asyncio.sleep(2.5)  # the retries find the key another claim's: left alone
        assert b.owns(applied) and not a.owns(applied)
        assert await b.owner_of(applied) == "b"
    finally:
        watch.cancel()
        await a.stop()
        await b.stop()


async def test_a_claim_answered_after_its_lease_lapsed_is_not_taken(
    stores: tuple[Store, Store], unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = _owners(stores, ttl_s=2)
    watch = asyncio.create_task(a.watch_lease())
    job = f"late-{unique}"
    store = stores[0]
    try:
        await wait_for(lambda: _leased(a), what="a lease")
        first = a._lease
        assert first is not None
        real_refresh, real_txn = first._client.refresh_lease, store.txn

        async def refresh_fails(lease_id: int) -> Any:
            if lease_id == first.id:
                raise ConnectionError("keep-alive refused by the test")
            return await real_refresh(lease_id)

        async def answered_late(*args: Any, **kwargs: Any) -> Any:
            result = await real_txn(*args, **kwargs)  # committed under the first lease
            await first.lost.wait()  # its answer comes after the lease lapsed
            await asyncio.sleep(0.3)
            return result

        monkeypatch.setattr(first._client, "refresh_lease", refresh_fails)
        monkeypatch.setattr(store, "txn", answered_late)
        assert not await a.try_acquire(job)
        monkeypatch.setattr(store, "txn", real_txn)
        assert not a.owns(job)
        await wait_for(lambda: b.try_acquire(job), timeout=10, what="b claims the job")
        assert not a.owns(job)
    finally:
        watch.cancel()
        await a.stop()
        await b.stop()


async def test_a_lease_whose_refreshes_hang_is_lost_within_its_ttl(
    stores: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = _owners(stores, ttl_s=2)
    watch = asyncio.create_task(a.watch_lease())
    try:
        await wait_for(lambda: _leased(a), what="a lease")
        lease = a._lease
        assert lease is not None
        granted = time.monotonic()

        async def hangs(lease_id: int) -> Any:
            await asyncio.Event().wait()  # a member gone silent: no reply, no reset

        monkeypatch.setattr(lease._client, "refresh_lease", hangs)
        await asyncio.wait_for(lease.lost.wait(), timeout=10)
        assert time.monotonic() - granted <= 2.0 + 0.5  # its TTL, not the refresh's wait
    finally:
        watch.cancel()
        await a.stop()
