"""The pauses between tries at a server that is not up yet, and the etcd target."""

from __future__ import annotations

from antdt.runtime.backoff import Backoff
from antdt.runtime.store.client import grpc_target


def test_pauses_double_up_to_the_cap_and_forever_never_gives_up() -> None:
    backoff = Backoff(first_s=0.2, max_s=2.0)
    assert [backoff.delay(n) for n in range(1, 7)] == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert backoff.delay(10_000) == 2.0
    assert not backoff.gives_up(10**9)
    assert Backoff(0.2, 2.0, deadline_s=30).gives_up(30)


def test_a_waiting_client_reports_less_often_as_it_waits() -> None:
    reported = [n for n in range(1, 70) if Backoff.worth_reporting(n)]
    assert reported == [1, 2, 4, 8, 16, 32, 64]


def test_several_etcd_endpoints_make_one_target_of_their_addresses() -> None:
    assert grpc_target("etcd-0:2379") == "etcd-0:2379"
    assert grpc_target("http://127.0.0.1:1,127.0.0.2:2/") == "ipv4:127.0.0.1:1,127.0.0.2:2"
    assert grpc_target("localhost:2379, 127.0.0.1:2380") == "ipv4:127.0.0.1:2379,127.0.0.1:2380"


def test_a_sub_second_etcd_timeout_is_kept_not_cut_to_zero() -> None:
    from antdt.runtime.config import EtcdSettings
    from antdt.runtime.store.client import EtcdClient

    client = EtcdClient(EtcdSettings(endpoint="127.0.0.1:1", timeout_s=0.5))
    assert client._timeout == 0.5  # the gRPC deadline of every call, seconds


async def test_a_watch_of_an_etcd_away_retries_less_often_as_it_waits() -> None:
    """Every follower's watch retried every 0.3 s, logging each time, for as long as
    etcd was away: now from 0.3 s doubling, said at tries 1, 2, 4, 8..."""
    import asyncio
    import contextlib

    from structlog.testing import capture_logs

    from antdt.runtime.config import EtcdSettings
    from antdt.runtime.servers.embedded import free_port
    from antdt.runtime.store import Store

    store = Store(EtcdSettings(endpoint=f"127.0.0.1:{free_port('127.0.0.1')}"))

    async def watch() -> None:
        async for _ in store.watch_prefix("/away/"):
            pass

    with capture_logs() as logs:
        task = asyncio.create_task(watch())
        await asyncio.sleep(3.0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    said = [e for e in logs if e["event"] == "watch interrupted; resuming"]
    assert 2 <= len(said) <= 3, said  # tries at ~0, 0.3, 0.9, 2.1 s: said at 1, 2 (and 4)
