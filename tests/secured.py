"""Servers with the production security on, for a whole test session: nats-server with a
user per role (the configuration generated from the roles, for every subject prefix
`antdt.<test>`) and TLS; etcd with a user per service limited to the tests' key prefix,
and TLS. A job's agents get a user bound to that job when their environment is made
(`agent_env`): the server reloads its configuration with it.

Services, agents and the CLI connect as their roles (`own_role`, `agent_env`,
`observer`); the test's own probes connect as `harness`, a user without limits (not an
AntDT role: a test reads and writes whatever it checks)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from antdt.runtime.config import EtcdSettings, NatsSettings, ServiceSettings, TlsSettings
from antdt.runtime.servers import EmbeddedEtcd, EmbeddedNats, ServerTls
from antdt.runtime.servers.natsconf import User, tls_block, user_entry, users_block
from antdt.runtime.servers.roles import Role
from antdt.runtime.store import EtcdUser, enable_auth
from antdt.testing import Pki, make_pki

#: Every test's subject prefix is `antdt.<unique>`: the roles' subjects, for all of them.
SUBJECT_PREFIXES = "antdt.*"
KEY_PREFIX = "/antdt-test/"
HARNESS, ROOT = "harness", "root"
SERVICES = ("monitor", "controller", "shards")
#: Users that are not a job's agents: the services, and the observer, policy and operator.
FIXED_ROLES = (*SERVICES, "observer", "policy", "operator")


def password(user: str) -> str:
    return f"pw-{user}-0123456"


def agent_user(job: str) -> str:
    return f"agent-{job}"


@dataclass
class SecuredServers:
    """The session's secured nats-server and etcd, and the agent users added so far."""

    nats: EmbeddedNats
    etcd: EmbeddedEtcd
    pki: Pki
    jobs: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    async def start(cls, root: Path) -> SecuredServers:
        pki = make_pki(root / "pki")
        tls = ServerTls(cert=pki.server_cert, key=pki.server_key, ca=pki.ca)
        etcd = EmbeddedEtcd(root / "etcd", tls=tls).start()
        nats = EmbeddedNats(root / "nats")
        servers = cls(nats, etcd, pki)
        try:
            nats.extra_config = servers.nats_config()
            nats.start()
            users = [EtcdUser(name, password(name), KEY_PREFIX) for name in SERVICES]
            await enable_auth(servers.etcd_as(None, KEY_PREFIX), users, password(ROOT))
        except BaseException:
            servers.stop()
            raise
        _RUNNING[nats.url] = servers
        return servers

    def stop(self) -> None:
        _RUNNING.pop(self.nats.url, None)
        self.nats.stop()
        self.etcd.stop()

    def nats_config(self) -> str:
        """The authorization block (every role's user, every job's agent, the harness)
        and the TLS block, client certificates required."""
        users = [User(user=r, password=password(r), role=Role(r)) for r in FIXED_ROLES]
        users += [
            User(user=agent_user(j), password=password(agent_user(j)), role=Role.AGENT, job=j)
            for j in sorted(self.jobs)
        ]
        entries = [user_entry(u, SUBJECT_PREFIXES) for u in users]
        block = users_block([*entries, {"user": HARNESS, "password": password(HARNESS)}])
        return block + tls_block(self.pki.server_cert, self.pki.server_key, self.pki.ca)

    def add_agent(self, job: str) -> str:
        """The user of `job`'s agents, added (and the server reloaded) on first use."""
        with self._lock:
            if job not in self.jobs:
                self.jobs.add(job)
                self.nats.reload(self.nats_config())
        return agent_user(job)

    @property
    def _log(self) -> Path:
        return self.nats.data_dir / "nats-server.log"

    def log_offset(self) -> int:
        return self._log.stat().st_size

    def violations(self, since: int) -> list[str]:
        """The publishes and subscriptions nats-server refused (its log) since `since`."""
        with self._log.open("rb") as log:
            log.seek(since)
            lines = log.read().decode(errors="replace").splitlines()
        return [line for line in lines if "Violation" in line]

    @property
    def tls(self) -> TlsSettings:
        pki = self.pki
        return TlsSettings(ca=pki.ca, cert=pki.client_cert, key=pki.client_key)

    def nats_as(self, user: str, prefix: str) -> NatsSettings:
        return NatsSettings(
            url=self.nats.url,
            subject_prefix=prefix,
            user=user,
            password=password(user),
            tls=self.tls,
        )

    def etcd_as(self, user: str | None, key_prefix: str) -> EtcdSettings:
        return EtcdSettings(
            endpoint=self.etcd.endpoint,
            key_prefix=key_prefix,
            lease_ttl_s=2,
            user=user,
            password=password(user) if user else None,
            tls=self.tls,
        )

    def harness(self, unique: str) -> ServiceSettings:
        """A test's settings (prefixes of its own), as the harness user."""
        return ServiceSettings(
            nats=self.nats_as(HARNESS, f"antdt.{unique}"),
            etcd=self.etcd_as(ROOT, f"{KEY_PREFIX}{unique}/"),
            replica_id=f"replica-{unique}",
        )


#: The running secured servers by NATS URL: how `agent_env` finds where to add a user.
_RUNNING: dict[str, SecuredServers] = {}


def _secured(settings: ServiceSettings | NatsSettings) -> SecuredServers | None:
    nats = settings.nats if isinstance(settings, ServiceSettings) else settings
    return _RUNNING.get(nats.url) if nats.user == HARNESS else None


def own_role(settings: ServiceSettings, name: str) -> ServiceSettings:
    """`settings` for service `name`: as its own users where `settings` are the harness's
    on secured servers, else unchanged."""
    servers = _secured(settings)
    if servers is None:
        return settings
    nats = servers.nats_as(name, settings.nats.subject_prefix)
    etcd = servers.etcd_as(name, settings.etcd.key_prefix)
    return settings.model_copy(update={"nats": nats, "etcd": etcd})


def observer(settings: NatsSettings) -> NatsSettings:
    """`settings` as the observer role (`antdt status`, `antdt report`) where secured."""
    servers = _secured(settings)
    return settings if servers is None else servers.nats_as("observer", settings.subject_prefix)


def _connection_env(nats: NatsSettings) -> dict[str, str]:
    env = {"ANTDT_NATS__URL": nats.url, "ANTDT_NATS__SUBJECT_PREFIX": nats.subject_prefix}
    if nats.user and nats.password:
        env.update(
            ANTDT_NATS__USER=nats.user, ANTDT_NATS__PASSWORD=nats.password.get_secret_value()
        )
    tls = {"CA": nats.tls.ca, "CERT": nats.tls.cert, "KEY": nats.tls.key}
    env.update({f"ANTDT_NATS__TLS__{k}": str(v) for k, v in tls.items() if v})
    return env


def agent_env(settings: ServiceSettings, job: str) -> dict[str, str]:
    """The NATS environment of `job`'s ranks: the server, the prefix and, where secured,
    the job's agent user and the client certificate."""
    servers = _secured(settings)
    if servers is None:
        return _connection_env(settings.nats)
    user = servers.add_agent(job)
    return _connection_env(servers.nats_as(user, settings.nats.subject_prefix))
