"""The control loop with the production security on: nats-server with a user per role
(the configuration generated from a permissions file) and TLS, etcd with a user per
service limited to the AntDT prefix and TLS; the services, the ranks' agents and the
test's own readers each connect as their role, with client certificates. The same
straggler job as tests/e2e/test_control_loop.py, held to the same checks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from antdt.observe import ensure_recording
from antdt.runtime.bus import Bus
from antdt.runtime.config import EtcdSettings, NatsSettings, ServiceSettings, TlsSettings
from antdt.runtime.servers import EmbeddedEtcd, EmbeddedNats, ServerTls
from antdt.runtime.servers.natsconf import authorization_block, load_permissions, tls_block
from antdt.runtime.store import EtcdUser, enable_auth
from antdt.schemas import Subjects
from antdt.testing import Pki, cores, make_pki
from tests.e2e.conftest import (
    WORLD,
    StragglerRun,
    collect,
    run_straggler_job,
    start_services,
    straggler_env,
)
from tests.e2e.test_control_loop import assert_mitigated

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.integration]

PREFIX, KEY_PREFIX, JOB = "antdt.sec", "/antdt-sec/", "secured-job"
SERVICES = ("monitor", "controller", "shards")
#: user -> (role, job): the services, the job's agents, and the test's readers.
NATS_USERS = {
    **{name: (name, None) for name in SERVICES},
    "agent-1": ("agent", JOB),
    "observer": ("observer", None),
    "policy": ("policy", None),
}


def _password(user: str) -> str:
    return f"pw-{user}-0123456"


@dataclass(frozen=True)
class Secured:
    nats: EmbeddedNats
    etcd: EmbeddedEtcd
    pki: Pki

    @property
    def tls(self) -> TlsSettings:
        return TlsSettings(ca=self.pki.ca, cert=self.pki.client_cert, key=self.pki.client_key)

    def nats_as(self, user: str) -> NatsSettings:
        return NatsSettings(
            url=self.nats.url,
            subject_prefix=PREFIX,
            user=user,
            password=_password(user),
            tls=self.tls,
        )

    def etcd_as(self, user: str | None) -> EtcdSettings:
        password = _password(user) if user else None
        return EtcdSettings(
            endpoint=self.etcd.endpoint,
            key_prefix=KEY_PREFIX,
            lease_ttl_s=2,
            user=user,
            password=password,
            tls=self.tls,
        )

    def service(self, name: str) -> ServiceSettings:
        return ServiceSettings(
            nats=self.nats_as(name), etcd=self.etcd_as(name), replica_id=f"secured-{name}"
        )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("secured")
    pki = make_pki(root / "pki")
    users = [
        {"user": u, "password": _password(u), "role": r, **({"job": j} if j else {})}
        for u, (r, j) in NATS_USERS.items()
    ]
    permissions = root / "permissions.json"
    permissions.write_text(json.dumps({"subject_prefix": PREFIX, "users": users}))
    config = authorization_block(load_permissions(permissions))
    config += tls_block(pki.server_cert, pki.server_key, pki.ca)
    nats = EmbeddedNats(root / "nats", extra_config=config).start()
    tls = ServerTls(cert=pki.server_cert, key=pki.server_key, ca=pki.ca)
    try:
        etcd = EmbeddedEtcd(root / "etcd", tls=tls).start()
    except BaseException:
        nats.stop()
        raise
    yield Secured(nats, etcd, pki)
    etcd.stop()
    nats.stop()


def _agent_env(secured: Secured, run: StragglerRun) -> dict[str, str]:
    env = straggler_env(run.settings, run.job, run.out)
    tls = secured.pki
    env.update(
        ANTDT_NATS__USER="agent-1",
        ANTDT_NATS__PASSWORD=_password("agent-1"),
        ANTDT_NATS__TLS__CA=str(tls.ca),
        ANTDT_NATS__TLS__CERT=str(tls.client_cert),
        ANTDT_NATS__TLS__KEY=str(tls.client_key),
    )
    return env


async def test_straggler_mitigated_with_roles_and_tls_on_nats_and_etcd(
    secured: Secured, tmp_path: Path
) -> None:
    if len(cores()) < WORLD:
        pytest.skip(f"pins {WORLD} ranks one per core: this process may use {len(cores())}")
    users = [EtcdUser(name, _password(name), KEY_PREFIX) for name in SERVICES]
    await enable_auth(secured.etcd_as(None), users, root_password=_password("root"))
    running = await start_services(
        secured.service("monitor"), settings_of=secured.service, window=8
    )
    # the test reads as the roles that may: steps and streams (monitor), health and
    # actions (observer), incidents (policy)
    buses = [
        await Bus(secured.nats_as(user), name=f"e2e-{user}").connect(retry_for_s=10)
        for user in ("monitor", "observer", "policy")
    ]
    steps, reader, incidents = buses
    run = StragglerRun(job=JOB, settings=secured.service("monitor"), out=tmp_path)
    try:
        await ensure_recording(steps, Subjects(PREFIX), run.settings.recording)
        await collect(steps, run, reader=reader, incidents=incidents)
        await run_straggler_job(run, _agent_env(secured, run))
        service_buses = [
            b for s in running.by_name.values() for b in (s.bus, getattr(s, "ranks_bus", None)) if b
        ]
        refused = [r for b in [*buses, *service_buses] for r in b.refused]
        assert not refused, refused
        assert_mitigated(run)
    finally:
        for bus in buses:
            await bus.close()
        await running.runtime.shutdown()
