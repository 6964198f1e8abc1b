"""A local control plane's credentials (`antdt up`): a NATS user per role with a random
password (the services, observer, policy, operator, and an agent user per job named),
etcd users for the services, and an env file per user that a process sources to connect
as it. Kept in the data directory, readable by its owner only, so that a restart on the
same directory keeps them."""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

from antdt.runtime.config import EtcdSettings, NatsSettings
from antdt.runtime.servers.natsconf import User, user_entry, users_block
from antdt.runtime.servers.roles import Role

SERVICES = ("monitor", "controller", "shards")
#: The users made whatever the jobs: the services, and who reads, proposes or operates.
FIXED_USERS = (*SERVICES, "observer", "policy", "operator")
#: etcd's own administrator, which turns its auth on (not an AntDT role).
ETCD_ROOT = "root"


def agent_user(job: str) -> str:
    return f"agent-{job}"


def _private(path: Path, text: str) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(text)


@dataclass
class LocalAuth:
    """The users of one local control plane, by name: password, and the job of an agent."""

    root: Path
    passwords: dict[str, str] = field(default_factory=dict)
    jobs: dict[str, str] = field(default_factory=dict)  # agent user -> its job
    etcd_enabled: bool = False

    @classmethod
    def open(cls, root: Path, jobs: Sequence[str] = ()) -> LocalAuth:
        """The credentials kept under `root` (made on first use), with an agent user for
        each of `jobs` added."""
        root.mkdir(parents=True, exist_ok=True)
        auth = cls(root)
        if auth._file.exists():
            kept = json.loads(auth._file.read_text())
            auth.passwords, auth.jobs = kept["passwords"], kept["jobs"]
            auth.etcd_enabled = kept["etcd_enabled"]
        for name in (*FIXED_USERS, ETCD_ROOT, *(agent_user(j) for j in jobs)):
            auth.passwords.setdefault(name, secrets.token_urlsafe(18))
        auth.jobs.update({agent_user(j): j for j in jobs})
        auth.save()
        return auth

    @property
    def _file(self) -> Path:
        return self.root / "credentials.json"

    def save(self) -> None:
        kept = {"passwords": self.passwords, "jobs": self.jobs, "etcd_enabled": self.etcd_enabled}
        _private(self._file, json.dumps(kept, indent=1))

    def users(self) -> list[User]:
        """Every NATS user: the fixed roles, then the agents."""
        users = [User(user=n, password=SecretStr(self.passwords[n]), role=n) for n in FIXED_USERS]
        return users + [
            User(user=u, password=SecretStr(self.passwords[u]), role=Role.AGENT, job=job)
            for u, job in sorted(self.jobs.items())
        ]

    def nats_config(self, subject_prefix: str) -> str:
        """nats-server's authorization block for every user."""
        return users_block([user_entry(u, subject_prefix) for u in self.users()])

    def nats_as(self, nats: NatsSettings, user: str) -> NatsSettings:
        return nats.model_copy(update={"user": user, "password": SecretStr(self.passwords[user])})

    def etcd_as(self, etcd: EtcdSettings, user: str) -> EtcdSettings:
        return etcd.model_copy(update={"user": user, "password": SecretStr(self.passwords[user])})

    def env_files(self, nats: NatsSettings, etcd: EtcdSettings) -> dict[str, Path]:
        """An env file per user (`ANTDT_NATS__*`; the services' also `ANTDT_ETCD__*`, an
        agent's `ANTDT_JOB`), in `root`/env, by user name."""
        out = self.root / "env"
        out.mkdir(exist_ok=True)
        files = {}
        for user in [u.user for u in self.users()]:
            env = {
                "ANTDT_NATS__URL": nats.url,
                "ANTDT_NATS__SUBJECT_PREFIX": nats.subject_prefix,
                "ANTDT_NATS__USER": user,
                "ANTDT_NATS__PASSWORD": self.passwords[user],
            }
            if user in SERVICES:
                env |= {
                    "ANTDT_ETCD__ENDPOINT": etcd.endpoint,
                    "ANTDT_ETCD__USER": user,
                    "ANTDT_ETCD__PASSWORD": self.passwords[user],
                }
            if user in self.jobs:
                env["ANTDT_JOB"] = self.jobs[user]
            files[user] = out / f"{user}.env"
            _private(files[user], "".join(f"export {k}={v}\n" for k, v in env.items()))
        return files
