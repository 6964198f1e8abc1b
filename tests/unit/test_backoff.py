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
