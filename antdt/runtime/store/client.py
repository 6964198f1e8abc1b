"""The etcd client of `Store`: aetcd's, on a list of endpoints, logging in as the
settings' user, over TLS where the settings name a CA (aetcd itself opens a plaintext
channel to one endpoint only)."""

from __future__ import annotations

import socket
import time
from typing import Any, cast

import aetcd
import grpc
from aetcd import rpc
from aetcd.client import _handle_errors
from aetcd.watcher import Watcher

from antdt.runtime.config import EtcdSettings, TlsSettings
from antdt.runtime.store.values import StoreError


def grpc_credentials(tls: TlsSettings) -> grpc.ChannelCredentials | None:
    """The channel credentials for `tls` (None: plaintext); StoreError for a file that
    cannot be read."""
    if not tls.enabled:
        return None
    expired = tls.expired_cert(time.time())
    if expired:
        raise StoreError(f"etcd TLS: {expired}: renew it (ANTDT_ETCD__TLS__CERT)")
    try:
        ca = tls.ca.read_bytes() if tls.ca else None
        cert = tls.cert.read_bytes() if tls.cert else None
        key = tls.key.read_bytes() if tls.key else None
    except OSError as exc:
        raise StoreError(f"etcd TLS files: {exc}") from None
    return grpc.ssl_channel_credentials(ca, key, cert)


def etcd_refusal(exc: BaseException) -> str | None:
    """Why etcd will never take this client as it is (credentials, permissions,
    certificates), in words naming the setting; None for what may pass."""
    text = str(exc).lower()
    if "authentication failed" in text or "invalid user id or password" in text:
        return "authentication failed: wrong user or password (ANTDT_ETCD__USER/PASSWORD)"
    if "permission denied" in text:
        return "permission denied: the user's role does not cover the key prefix"
    if "certificate has expired" in text:
        return f"the server's TLS certificate has expired ({exc}): renew it"
    if "certificate" in text or "ssl_error" in text or "tls handshake" in text:
        return f"TLS failed ({exc}): check ANTDT_ETCD__TLS__CA, __CERT and __KEY"
    return None


def grpc_target(endpoints: str) -> str:
    """The gRPC target of comma-separated `host:port` endpoints: one as it is; several
    as one `ipv4:` target of their addresses, which gRPC tries in turn (pick_first) and
    moves off when the member it uses goes away."""
    parts = [e.strip().split("://", 1)[-1].rstrip("/") for e in endpoints.split(",")]
    parts = [p for p in parts if p]
    if len(parts) == 1:
        return parts[0]
    addresses = []
    for part in parts:
        host, _, port = part.rpartition(":")
        infos = socket.getaddrinfo(host or "127.0.0.1", None, socket.AF_INET)
        addresses.append(f"{cast(str, infos[0][4][0])}:{port or 2379}")
    return "ipv4:" + ",".join(addresses)


#: The largest reply the client takes, bytes: gRPC's default (4 MiB) is the keys of one
#: job of ~100,000 ranks (its hellos), and a claim round reads every job's keys.
MAX_REPLY_BYTES = 256 * 1024 * 1024


class EtcdClient(aetcd.Client):
    """`aetcd.Client` on a list of endpoints, over TLS where the settings name a CA: its
    `connect` does what aetcd's does, on the channel to that target."""

    _is_connecting: bool
    metadata: tuple[tuple[str, str], ...] | None

    def __init__(self, settings: EtcdSettings) -> None:
        password = settings.password.get_secret_value() if settings.password else None
        # aetcd types it an int; gRPC takes float seconds (int() made 0.5 a 0 s deadline)
        timeout: Any = settings.timeout_s
        options = {"grpc.max_receive_message_length": MAX_REPLY_BYTES}
        super().__init__(
            username=settings.user, password=password, timeout=timeout, options=options
        )
        self._endpoints = settings.endpoint
        self._credentials = grpc_credentials(settings.tls)

    def _channel(self) -> Any:
        target, options = grpc_target(self._endpoints), list(self._options.items())
        if self._credentials is None:
            return rpc.insecure_channel(target, options=options)
        return rpc.secure_channel(target, self._credentials, options=options)

    @_handle_errors
    async def connect(self) -> None:
        if self._connected.is_set() or self._is_connecting:
            return await super().connect()  # type: ignore[no-any-return]
        self._is_connecting = True
        try:
            self.channel = self._channel()
            await self._authenticate()
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            stub = rpc.WatchStub(self.channel)
            self._watcher = Watcher(stub, timeout=self._timeout, metadata=self.metadata)
            self._connected.set()
        finally:
            self._is_connecting = False
        return None

    async def _authenticate(self) -> None:
        if self._username is None or self._password is None:
            return
        self.auth_stub = rpc.AuthStub(self.channel)
        request: Any = rpc.AuthenticateRequest(name=self._username, password=self._password)
        resp = await self.auth_stub.Authenticate(request, timeout=self._timeout)
        self.metadata = (("token", resp.token),)

    @_handle_errors
    async def log_in_again(self) -> None:
        """A new token on the open channel, for the calls made from now on (the
        watcher's new watches too): etcd forgets a token unused for its
        `--auth-token-ttl` (300 s by default), and a member that did not see the login."""
        if self.channel is None:
            return
        await self._authenticate()
        if self._watcher is not None:
            self._watcher._metadata = self.metadata
