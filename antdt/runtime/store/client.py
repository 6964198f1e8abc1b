"""The etcd client of `Store`: aetcd's, logging in as the settings' user, over TLS where
the settings name a CA (aetcd itself opens plaintext channels only)."""

from __future__ import annotations

from typing import Any

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
    if "certificate" in text or "ssl" in text or "handshake" in text:
        return f"TLS failed ({exc}): check ANTDT_ETCD__TLS__CA, __CERT and __KEY"
    return None


class EtcdClient(aetcd.Client):
    """`aetcd.Client` with TLS: `connect` does what aetcd's does, on a secure channel."""

    _is_connecting: bool
    metadata: tuple[tuple[str, str], ...] | None

    def __init__(self, settings: EtcdSettings, host: str, port: int) -> None:
        password = settings.password.get_secret_value() if settings.password else None
        super().__init__(
            host=host,
            port=port,
            username=settings.user,
            password=password,
            timeout=int(settings.timeout_s),
        )
        self._credentials = grpc_credentials(settings.tls)

    @_handle_errors
    async def connect(self) -> None:
        if self._credentials is None:
            return await super().connect()  # type: ignore[no-any-return]
        if self._connected.is_set() or self._is_connecting:
            return await super().connect()  # type: ignore[no-any-return]
        self._is_connecting = True
        try:
            target = f"{self._host}:{self._port}"
            self.channel = rpc.secure_channel(target, self._credentials, self._options.items())
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
