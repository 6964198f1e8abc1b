"""Servers with the production security on, for the bench: nats-server with a user per
role and TLS (client certificates), etcd with TLS and a user per service limited to the
bench's prefix; and `Access`, how each of the bench's clients reaches either kind of
servers (plaintext, or as its role's user over TLS)."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from antdt.runtime.config import EtcdSettings, NatsSettings, TlsSettings
from antdt.runtime.servers import EmbeddedCluster, EmbeddedEtcd, EmbeddedNats, ServerTls
from antdt.runtime.servers.natsconf import authorization_block, load_permissions, tls_block
from antdt.runtime.store import EtcdUser, enable_auth
from antdt.testing import Pki, make_pki

SUBJECT_PREFIX, KEY_PREFIX = "bench.sec", "/bench/sec/"
#: The jobs whose ranks the bench's agents stand for (an agent user is bound to one job).
INGEST_JOB, CYCLES_JOB = "bench", "secured-cycles"
#: NATS user -> (role, job).
NATS_USERS = {
    "monitor": ("monitor", None),
    "shards": ("shards", None),
    "policy": ("policy", None),
    "agent-ingest": ("agent", INGEST_JOB),
    "agent-cycles": ("agent", CYCLES_JOB),
}
ETCD_USERS = ("monitor", "shards")


@dataclass(frozen=True)
class Access:
    """Where the bench's clients connect and as whom: without `passwords`, plaintext and
    no users (the user names are then ignored)."""

    nats_url: str
    etcd_endpoint: str
    subject_prefix: str
    key_prefix: str
    server_pids: dict[str, int | None]
    passwords: dict[str, str] = field(default_factory=dict)
    tls: dict[str, str] = field(default_factory=dict)  # TlsSettings fields, as paths

    @staticmethod
    def plain(cluster: EmbeddedCluster, tag: str) -> Access:
        pids = {"nats": cluster.nats.pid, "etcd": cluster.etcd.pid}
        return Access(
            cluster.nats.url, cluster.etcd.endpoint, f"bench.{tag}", f"/bench/{tag}/", pids
        )

    def _login(self, user: str) -> dict[str, Any]:
        if not self.passwords:
            return {}
        return {"user": user, "password": self.passwords[user], "tls": self.tls}

    def nats_fields(self, user: str) -> dict[str, Any]:
        """NatsSettings' fields as JSON (the password in clear: for a child process)."""
        return {"url": self.nats_url, "subject_prefix": self.subject_prefix, **self._login(user)}

    def nats(self, user: str) -> NatsSettings:
        return NatsSettings(**self.nats_fields(user))

    def etcd_fields(self, user: str) -> dict[str, Any]:
        return {"endpoint": self.etcd_endpoint, "key_prefix": self.key_prefix, **self._login(user)}

    def etcd(self, user: str) -> EtcdSettings:
        return EtcdSettings(**self.etcd_fields(user))


def _password(user: str) -> str:
    return f"bench-{user}-pw"


@asynccontextmanager
async def bench_servers(*, secure: bool) -> AsyncIterator[Access]:
    """A nats-server and an etcd of their own, started alike, with users and TLS on where
    `secure` (else plaintext: the baseline differs in security alone), for as long as
    the block runs; the Access of the bench's clients to them."""
    with tempfile.TemporaryDirectory(prefix="antdt-bench-servers-") as tmp:
        root = Path(tmp)
        pki = make_pki(root / "pki")
        config = _nats_config(root, pki) if secure else ""
        server_tls = ServerTls(pki.server_cert, pki.server_key, pki.ca) if secure else None
        nats = EmbeddedNats(root / "nats", extra_config=config).start()
        try:
            etcd = EmbeddedEtcd(root / "etcd", tls=server_tls).start()
            try:
                pids = {"nats": nats.pid, "etcd": etcd.pid}
                plain = Access(nats.url, etcd.endpoint, SUBJECT_PREFIX, KEY_PREFIX, pids)
                yield await _secure(plain, pki) if secure else plain
            finally:
                etcd.stop()
        finally:
            nats.stop()


def _nats_config(root: Path, pki: Pki) -> str:
    users = [
        {"user": u, "password": _password(u), "role": r, **({"job": j} if j else {})}
        for u, (r, j) in NATS_USERS.items()
    ]
    permissions = root / "permissions.json"
    permissions.write_text(json.dumps({"subject_prefix": SUBJECT_PREFIX, "users": users}))
    config = authorization_block(load_permissions(permissions))
    return config + tls_block(pki.server_cert, pki.server_key, pki.ca)


async def _secure(plain: Access, pki: Pki) -> Access:
    """`plain` with etcd's users made and auth on, each client as its user over TLS."""
    tls = {"ca": str(pki.ca), "cert": str(pki.client_cert), "key": str(pki.client_key)}
    TlsSettings(**tls)  # checked once, here
    root_access = EtcdSettings(endpoint=plain.etcd_endpoint, key_prefix=KEY_PREFIX, tls=tls)
    etcd_users = [EtcdUser(u, _password(u), KEY_PREFIX) for u in ETCD_USERS]
    await enable_auth(root_access, etcd_users, root_password=_password("root"))
    passwords = {u: _password(u) for u in {*NATS_USERS, *ETCD_USERS}}
    return dataclasses.replace(plain, passwords=passwords, tls=tls)
