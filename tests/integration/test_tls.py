"""TLS between the clients and real servers, with certificates the test makes: a client
with the CA (and its own certificate) works; one without it, or with an expired
certificate, or facing a server whose certificate expired, is refused in clear words."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from antdt.runtime.bus import Bus, BusError
from antdt.runtime.config import EtcdSettings, NatsSettings, TlsSettings
from antdt.runtime.servers import EmbeddedEtcd, EmbeddedNats, ServerTls
from antdt.runtime.servers.natsconf import tls_block
from antdt.runtime.store import Store, StoreError
from antdt.testing.pki import SERVER_SAN, Pki, expired_certificate, make_pki

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_nats(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[EmbeddedNats]:
    root = tmp_path_factory.mktemp("nats-tls")
    server = EmbeddedNats(root, extra_config=tls_block(pki.server_cert, pki.server_key, pki.ca))
    yield server.start()
    server.stop()


def _nats(server: EmbeddedNats, tls: TlsSettings) -> NatsSettings:
    return NatsSettings(url=server.url, tls=tls)


async def test_a_client_with_the_ca_and_its_certificate_talks_over_tls(
    tls_nats: EmbeddedNats, pki: Pki
) -> None:
    tls = TlsSettings(ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
    bus = await Bus(_nats(tls_nats, tls), name="tls").connect(retry_for_s=5)
    try:
        assert await bus.rtt() > 0
    finally:
        await bus.close()


async def test_a_client_without_the_ca_is_refused_at_once_saying_so(
    tls_nats: EmbeddedNats, pki: Pki, tmp_path: Path
) -> None:
    other = make_pki(tmp_path, ca="other")
    for tls in (
        TlsSettings(),  # the system's CAs: none of them signed the server
        TlsSettings(ca=other.ca, cert=other.client_cert, key=other.client_key),
    ):
        started = time.monotonic()
        with pytest.raises(BusError, match=r"not trusted .*ANTDT_NATS__TLS__CA"):
            await Bus(_nats(tls_nats, tls), name="no-ca").connect(retry_for_s=20)
        assert time.monotonic() - started < 5


async def test_a_client_without_its_certificate_is_refused(
    tls_nats: EmbeddedNats, pki: Pki
) -> None:
    with pytest.raises(BusError, match="requires a client certificate"):
        await Bus(_nats(tls_nats, TlsSettings(ca=pki.ca)), name="no-cert").connect(retry_for_s=5)


async def test_an_expired_client_certificate_is_refused_saying_so(
    tls_nats: EmbeddedNats, pki: Pki
) -> None:
    cert, key = expired_certificate(pki, "nats-client-expired")
    tls = TlsSettings(ca=pki.ca, cert=cert, key=key)
    started = time.monotonic()
    with pytest.raises(BusError, match=r"client certificate .*expired.*ANTDT_NATS__TLS__CERT"):
        await Bus(_nats(tls_nats, tls), name="expired").connect(retry_for_s=20)
    assert time.monotonic() - started < 5


async def test_a_server_certificate_that_expired_is_refused_saying_so(
    pki: Pki, tmp_path: Path
) -> None:
    cert, key = expired_certificate(pki, "nats-server-expired", SERVER_SAN)
    server = EmbeddedNats(tmp_path, extra_config=tls_block(cert, key, pki.ca)).start()
    tls = TlsSettings(ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
    started = time.monotonic()
    try:
        with pytest.raises(BusError, match=r"server's TLS certificate has expired"):
            await Bus(_nats(server, tls), name="server-expired").connect(retry_for_s=20)
    finally:
        server.stop()
    assert time.monotonic() - started < 5


def test_tls_settings_name_what_is_missing(pki: Pki) -> None:
    with pytest.raises(ValueError, match="needs its key"):
        TlsSettings(ca=pki.ca, cert=pki.client_cert)
    with pytest.raises(ValueError, match="needs the server's CA"):
        TlsSettings(cert=pki.client_cert, key=pki.client_key)


async def test_an_unreadable_ca_file_is_a_clear_error(
    tls_nats: EmbeddedNats, tmp_path: Path
) -> None:
    tls = TlsSettings(ca=tmp_path / "missing.pem")
    with pytest.raises(BusError, match="NATS TLS files"):
        await Bus(_nats(tls_nats, tls), name="bad-ca").connect(retry_for_s=2)


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[EmbeddedEtcd]:
    tls = ServerTls(cert=pki.server_cert, key=pki.server_key, ca=pki.ca)
    server = EmbeddedEtcd(tmp_path_factory.mktemp("etcd-tls"), tls=tls)
    yield server.start()
    server.stop()


def _etcd(server: EmbeddedEtcd, tls: TlsSettings) -> EtcdSettings:
    return EtcdSettings(endpoint=server.endpoint, key_prefix="/antdt-tls/", tls=tls)


async def test_the_store_with_the_ca_and_its_certificate_talks_over_tls(
    tls_etcd: EmbeddedEtcd, pki: Pki
) -> None:
    tls = TlsSettings(ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
    store = await Store(_etcd(tls_etcd, tls)).connect(retry_for_s=10)
    try:
        await store.put(store.key("k"), b"v")
        got = await store.get(store.key("k"))
        assert got is not None and got.value == b"v"
    finally:
        await store.close()


async def test_the_store_without_the_ca_is_refused_saying_so(
    tls_etcd: EmbeddedEtcd, tmp_path: Path
) -> None:
    other = make_pki(tmp_path, ca="other")
    tls = TlsSettings(ca=other.ca, cert=other.client_cert, key=other.client_key)
    started = time.monotonic()
    with pytest.raises(StoreError, match=r"TLS failed .*ANTDT_ETCD__TLS__CA"):
        await Store(_etcd(tls_etcd, tls)).connect(retry_for_s=20)
    assert time.monotonic() - started < 10


async def test_the_store_with_an_expired_client_certificate_is_refused_saying_so(
    tls_etcd: EmbeddedEtcd, pki: Pki
) -> None:
    cert, key = expired_certificate(pki, "etcd-client-expired")
    tls = TlsSettings(ca=pki.ca, cert=cert, key=key)
    started = time.monotonic()
    with pytest.raises(StoreError, match=r"expired.*ANTDT_ETCD__TLS__CERT"):
        await Store(_etcd(tls_etcd, tls)).connect(retry_for_s=20)
    assert time.monotonic() - started < 10


async def test_the_store_facing_an_expired_server_certificate_is_refused_saying_so(
    pki: Pki, tmp_path: Path
) -> None:
    cert, key = expired_certificate(pki, "etcd-server-expired", SERVER_SAN)
    probe = (pki.client_cert, pki.client_key)  # a current one: etcd checks the probe's dates
    server = EmbeddedEtcd(tmp_path, tls=ServerTls(cert=cert, key=key, ca=pki.ca, probe=probe))
    server.start()
    tls = TlsSettings(ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
    started = time.monotonic()
    try:
        with pytest.raises(StoreError, match=r"server's TLS certificate has expired"):
            await Store(_etcd(server, tls)).connect(retry_for_s=20)
    finally:
        server.stop()
    assert time.monotonic() - started < 10
