"""deploy/compose.yaml brought up with podman-compose as a project of its own: a copy of
deploy/ with generated secrets (a CA, server and client certificates, a NATS user per
role, passwords), the override of deploy/test/override.yaml, health checks run until
every container passes, and a teardown that leaves no container, volume or network."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from antdt.runtime.config import NatsSettings, TlsSettings
from antdt.runtime.servers.natsconf import authorization_block, load_permissions
from antdt.testing import make_pki

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERRIDE = DEPLOY / "test" / "override.yaml"
#: Started: all but Grafana, whose image cannot be had here (nor built from Debian's).
SERVICES = (
    "nats-1",
    "nats-2",
    "nats-3",
    "etcd",
    "etcd-users",
    "jaeger",
    "monitor",
    "controller",
    "shards",
    "prometheus",
)
HEALTHY = ("nats-1", "nats-2", "nats-3", "etcd", "monitor", "controller", "shards")
#: compose.yaml runs two replicas of each service (at least).
REPLICATED = ("monitor", "controller", "shards")
#: Host ports of the three NATS nodes (compose.yaml's `ports`).
NATS_URL = "tls://localhost:4222,tls://localhost:4223,tls://localhost:4224"


def podman(*args: str, check: bool = True, timeout: float = 120) -> str:
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@dataclass
class Project:
    """One compose project under `root` (a copy of deploy/), named `name`."""

    root: Path
    name: str
    compose: list[str]
    jobs: tuple[str, ...]
    passwords: dict[str, str] = field(default_factory=dict)

    @property
    def spans_file(self) -> Path:
        return self.root / "spans" / "spans.jsonl"

    @property
    def certs(self) -> Path:
        return self.root / "secrets" / "certs"

    def nats_as(self, user: str) -> NatsSettings:
        tls = TlsSettings(
            ca=self.certs / "ca.pem",
            cert=self.certs / "client.pem",
            key=self.certs / "client.key",
        )
        return NatsSettings(url=NATS_URL, user=user, password=self.passwords[user], tls=tls)

    def agent_env(self, job: str) -> dict[str, str]:
        """What a rank of `job` needs to reach this deployment (docs: "Deploy with compose")."""
        nats = self.nats_as(f"agent-{job}")
        assert nats.tls.ca and nats.tls.cert and nats.tls.key and nats.password
        return {
            "ANTDT_NATS__URL": nats.url,
            "ANTDT_NATS__USER": nats.user or "",
            "ANTDT_NATS__PASSWORD": nats.password.get_secret_value(),
            "ANTDT_NATS__TLS__CA": str(nats.tls.ca),
            "ANTDT_NATS__TLS__CERT": str(nats.tls.cert),
            "ANTDT_NATS__TLS__KEY": str(nats.tls.key),
        }

    def run(self, *args: str, timeout: float = 600) -> None:
        subprocess.run(
            [*self.compose, "-p", self.name, "-f", "compose.yaml", "-f", str(OVERRIDE), *args],
            cwd=self.root,
            env={
                **os.environ,
                "ANTDT_TEST_SRC": str(REPO),
                "ANTDT_TEST_SPANS": str(self.spans_file.parent),
            },
            check=True,
            timeout=timeout,
            stdout=subprocess.DEVNULL,
        )

    def containers(self) -> list[dict[str, Any]]:
        label = f"label=io.podman.compose.project={self.name}"
        listed: list[dict[str, Any]] = json.loads(
            podman("ps", "-a", "--filter", label, "--format", "json") or "[]"
        )
        return listed

    def of(self, service: str) -> list[str]:
        """The names of `service`'s containers (its replicas), sorted."""
        key = "com.docker.compose.service"
        return sorted(c["Names"][0] for c in self.containers() if c["Labels"].get(key) == service)


def prepare(root: Path, name: str, compose: list[str], jobs: tuple[str, ...]) -> Project:
    """Copy deploy/ to `root` and write its secrets (compose.yaml's header lists them)."""
    shutil.copytree(DEPLOY, root, ignore=shutil.ignore_patterns("secrets", ".env", "test"))
    project = Project(root, name, compose, jobs)
    pki = make_pki(root / "pki", server_names=("nats-1", "nats-2", "nats-3", "etcd"))
    project.certs.mkdir(parents=True)
    for src, dst in [
        (pki.ca, "ca.pem"),
        (pki.server_cert, "server.pem"),
        (pki.server_key, "server.key"),
        (pki.client_cert, "client.pem"),
        (pki.client_key, "client.key"),
    ]:
        shutil.copy(src, project.certs / dst)
        (project.certs / dst).chmod(0o644)  # read by the containers' users
    roles = {"monitor": "monitor", "controller": "controller", "shards": "shards"}
    roles |= {"observer": "observer", **{f"agent-{job}": "agent" for job in jobs}}
    project.passwords = {user: secrets.token_hex(12) for user in (*roles, "root")}
    users = [
        {"user": u, "password": project.passwords[u], "role": r}
        | ({"job": u.removeprefix("agent-")} if r == "agent" else {})
        for u, r in roles.items()
    ]
    permissions = root / "permissions.json"
    prefix = NatsSettings().subject_prefix
    permissions.write_text(json.dumps({"subject_prefix": prefix, "users": users}))
    (root / "secrets" / "nats-auth.conf").write_text(
        authorization_block(load_permissions(permissions))
    )
    env = {f"ANTDT_{s.upper()}_PASSWORD": project.passwords[s] for s in roles if s in SERVICES}
    env["ANTDT_ETCD_ROOT_PASSWORD"] = project.passwords["root"]
    (root / ".env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    project.spans_file.parent.mkdir()
    _without_nomad_discovery(root / "prometheus.yml")
    return project


def _without_nomad_discovery(config: Path) -> None:
    """Debian's Prometheus (the image built here) has no nomad_sd_configs: drop the
    scrape job for Nomad (the last), keeping compose's."""
    text = config.read_text()
    cut = text.index("  - job_name: antdt-nomad")
    config.write_text(text[:cut])


def wait_healthy(project: Project, timeout: float = 240) -> None:
    """Run every container's health check (podman runs none without systemd) until all
    of HEALTHY's pass and etcd-users has exited 0; a service without a check, or with
    fewer than two replicas, fails."""
    single = [s for s in REPLICATED if len(project.of(s)) < 2]
    if single:
        raise RuntimeError(f"one replica only of {single}: compose.yaml's deploy.replicas unread")
    deadline, pending = time.monotonic() + timeout, set(HEALTHY)
    while time.monotonic() < deadline:
        for service in sorted(pending):
            names = project.of(service)
            checks = [
                subprocess.run(["podman", "healthcheck", "run", n], capture_output=True, text=True)
                for n in names
            ]
            if any("no defined healthcheck" in c.stderr for c in checks):
                raise RuntimeError(f"{service}: no health check in compose.yaml")
            if names and all(c.returncode == 0 for c in checks):
                pending.discard(service)
        users = [c for c in project.containers() if c["Names"][0] in project.of("etcd-users")]
        users_done = any(c["State"] == "exited" and c["ExitCode"] == 0 for c in users)
        if not pending and users_done:
            return
        time.sleep(2)
    logs = {s: podman("logs", "--tail", "5", *project.of(s)[:1], check=False) for s in pending}
    raise RuntimeError(f"not healthy after {timeout:.0f}s: {sorted(pending)}\n{logs}")


def tear_down(project: Project) -> list[str]:
    """Stop and remove the project's containers, volumes and network; what is left."""
    try:
        project.run("down", "-v", "-t", "5", timeout=300)
    except (subprocess.SubprocessError, OSError) as exc:
        print(f"compose down failed ({exc}); removing by label")
    label = f"label=io.podman.compose.project={project.name}"
    ids = podman("ps", "-aq", "--filter", label, check=False).split()
    if ids:
        podman("rm", "-f", "-t", "2", *ids, check=False)
    volumes = podman("volume", "ls", "-q", "--filter", label, check=False).split()
    if volumes:
        podman("volume", "rm", "-f", *volumes, check=False)
    podman("network", "rm", "-f", f"{project.name}_default", check=False)
    left = podman("ps", "-aq", "--filter", label, check=False).split()
    return left + podman("volume", "ls", "-q", "--filter", label, check=False).split()
