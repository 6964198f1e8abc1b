"""etcd with authentication on (real etcd from the embedded wheel): each service's user
works in the AntDT key prefix, and is refused outside it or with a wrong password."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aetcd.exceptions
import pytest
from structlog.testing import capture_logs

from antdt.runtime.config import EtcdSettings
from antdt.runtime.servers import EmbeddedEtcd
from antdt.runtime.store import EtcdUser, Store, StoreError, enable_auth, retrying

pytestmark = pytest.mark.integration

PREFIX = "/antdt/v1/"
SERVICES = ("monitor", "controller", "shards")


def _password(name: str) -> str:
    return f"pw-{name}-0123"


@pytest.fixture(scope="module")
def auth_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEtcd]:
    server = EmbeddedEtcd(tmp_path_factory.mktemp("etcd-auth")).start()
    users = [EtcdUser(name, _password(name), PREFIX) for name in SERVICES]
    users.append(EtcdUser("elsewhere", _password("elsewhere"), "/other/"))
    plain = EtcdSettings(endpoint=server.endpoint, key_prefix=PREFIX)
    asyncio.run(enable_auth(plain, users, root_password="root-pw-0123"))
    yield server
    server.stop()


def _settings(server: EmbeddedEtcd, user: str, password: str | None = None) -> EtcdSettings:
    return EtcdSettings(
        endpoint=server.endpoint,
        key_prefix=PREFIX,
        user=user,
        password=password or _password(user),
    )


async def test_each_service_user_reads_writes_leases_and_watches_its_prefix(
    auth_etcd: EmbeddedEtcd,
) -> None:
    for name in SERVICES:
        store = await Store(_settings(auth_etcd, name)).connect(retry_for_s=5)
        try:
            key = store.key(f"owners/{name}/job")
            since = await store.current_revision() + 1
            watch = store.watch_prefix(store.key(f"owners/{name}/"), start_revision=since)
            first = asyncio.ensure_future(anext(watch))
            lease = await store.grant_lease(5)
            await store.put(key, name.encode(), lease=lease)
            assert (await asyncio.wait_for(first, 5)).key == key
            got = await store.get(key)
            assert got is not None and got.value == name.encode()
            assert [v.key for v in await store.get_prefix(store.key(f"owners/{name}/"))] == [key]
            await lease.revoke()
            assert await store.get(key) is None
            await watch.aclose()
        finally:
            await store.close()


async def test_a_wrong_password_is_refused_at_once(auth_etcd: EmbeddedEtcd) -> None:
    started = time.monotonic()
    with pytest.raises(StoreError, match="authentication failed: wrong user or password"):
        await Store(_settings(auth_etcd, "monitor", "wrong-password")).connect(retry_for_s=20)
    assert time.monotonic() - started < 5


async def test_a_key_outside_the_prefix_is_refused(auth_etcd: EmbeddedEtcd) -> None:
    store = await Store(_settings(auth_etcd, "controller")).connect(retry_for_s=5)
    try:
        with pytest.raises(StoreError, match="permission denied"):
            await store.put("/other/secret", b"x")
        with pytest.raises(StoreError, match="permission denied"):
            await store.get("/antdt/v2/jobs/")
    finally:
        await store.close()


async def test_a_user_of_another_prefix_cannot_connect_to_the_antdt_one(
    auth_etcd: EmbeddedEtcd,
) -> None:
    with pytest.raises(StoreError, match="permission denied: the user's role does not cover"):
        await Store(_settings(auth_etcd, "elsewhere")).connect(retry_for_s=5)


def test_the_range_of_a_prefix_ends_past_its_last_key() -> None:
    from antdt.runtime.store.auth import prefix_end

    assert prefix_end("/antdt/v1/") == b"/antdt/v10"


async def test_a_service_keeps_its_login_across_an_etcd_restart(auth_etcd: EmbeddedEtcd) -> None:
    """The token a store logged in with still works once etcd is back from a kill -9."""
    store = await Store(_settings(auth_etcd, "shards")).connect(retry_for_s=5)
    try:
        await store.put(store.key("before"), b"1")
        auth_etcd.kill()
        auth_etcd.start()
        await retrying(lambda: store.put(store.key("after"), b"2"), attempts=100)
        got = await store.get(store.key("after"))
        assert got is not None and got.value == b"2"
    finally:
        await store.close()


async def test_a_service_idle_past_the_token_ttl_logs_in_again(tmp_path: Path) -> None:
    """etcd forgets a login unused for --auth-token-ttl (5 minutes by default): a
    service idle that long, holding only a lease, must still write, read and lease."""
    server = EmbeddedEtcd(tmp_path, extra_args=("--auth-token-ttl", "1")).start()
    try:
        plain = EtcdSettings(endpoint=server.endpoint, key_prefix=PREFIX)
        users = [EtcdUser("shards", _password("shards"), PREFIX)]
        await enable_auth(plain, users, root_password="root-pw-0123")
        store = await Store(_settings(server, "shards")).connect(retry_for_s=5)
        probe = await Store(_settings(server, "shards")).connect(retry_for_s=5)
        try:
            lease = await store.grant_lease(3)
            await store.put(store.key("owned"), b"1", lease=lease)
            await asyncio.sleep(3.5)  # idle: etcd's token keeper drops both logins
            with pytest.raises(aetcd.exceptions.UnauthenticatedError):
                await probe.client.get(probe.key("probe").encode())
            with capture_logs() as logs:
                await store.put(store.key("after"), b"2")
                got = await store.get(store.key("after"))
                second = await store.grant_lease(3)
                await second.revoke()
            assert got is not None and got.value == b"2"
            assert [e["call"] for e in logs if e["event"] == "etcd login renewed"] == ["put"]
            assert not lease.lost.is_set() and await store.get(store.key("owned")) is not None
        finally:
            await probe.close()
            await store.close()
    finally:
        server.stop()
