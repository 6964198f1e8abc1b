"""etcd authentication for AntDT: one user per service, each with a role that may read
and write the AntDT key prefix and nothing else, then auth turned on. Run once, when a
deployment is set up (etcd's auth still off); what exists already is kept, so a setup
cut short may be run again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aetcd import rpc

from antdt.runtime.config import EtcdSettings
from antdt.runtime.store.client import EtcdClient
from antdt.runtime.store.values import StoreError

ROOT = "root"


@dataclass(frozen=True)
class EtcdUser:
    """A service's etcd user, allowed `prefix` only (role `antdt-{name}`)."""

    name: str
    password: str
    prefix: str

    @property
    def role(self) -> str:
        return f"antdt-{self.name}"


def prefix_end(prefix: str) -> bytes:
    """Etcd's range end for every key starting with `prefix`: the prefix with its last
    byte one higher."""
    raw = prefix.encode()
    if not raw:
        raise ValueError("an empty prefix is every key: give the AntDT key prefix")
    stripped = raw.rstrip(b"\xff")
    if not stripped:
        return b"\x00"
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _requests(users: Sequence[EtcdUser], root_password: str) -> list[tuple[str, Any]]:
    """The Auth RPCs, in order: root first (etcd enables auth only with a root user)."""
    calls: list[tuple[str, Any]] = [
        ("UserAdd", rpc.AuthUserAddRequest(name=ROOT, password=root_password)),
        ("UserGrantRole", rpc.AuthUserGrantRoleRequest(user=ROOT, role=ROOT)),
    ]
    for user in users:
        perm = rpc.Permission(
            permType=rpc.Permission.READWRITE,
            key=user.prefix.encode(),
            range_end=prefix_end(user.prefix),
        )
        calls += [
            ("RoleAdd", rpc.AuthRoleAddRequest(name=user.role)),
            ("RoleGrantPermission", rpc.AuthRoleGrantPermissionRequest(name=user.role, perm=perm)),
            ("UserAdd", rpc.AuthUserAddRequest(name=user.name, password=user.password)),
            ("UserGrantRole", rpc.AuthUserGrantRoleRequest(user=user.name, role=user.role)),
        ]
    return [*calls, ("AuthEnable", rpc.AuthEnableRequest())]


async def enable_auth(
    settings: EtcdSettings, users: Sequence[EtcdUser], root_password: str
) -> None:
    """Create the users and their roles, then turn etcd's auth on. `settings`: where
    etcd is (its TLS too), without a user: etcd's auth is still off."""
    client = EtcdClient(settings.model_copy(update={"user": None, "password": None}))
    try:
        await client.connect()
        stub = rpc.AuthStub(client.channel)
        for method, request in _requests(users, root_password):
            try:
                await getattr(stub, method)(request, timeout=settings.timeout_s)
            except rpc.AioRpcError as exc:
                if "already" not in (exc.details() or ""):
                    raise StoreError(f"etcd {method}: {exc.details()}") from None
    finally:
        await client.close()
