"""The shipped deployments (deploy/compose.yaml, deploy/antdt.nomad.hcl) name only
settings the services have, with values they accept. Settings ignore unknown `ANTDT_*`
variables (an agent's and a service's share the prefix), so a misspelt or renamed one in
a deployment would be dropped without a word: this keeps the files true to the code."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from structlog.testing import capture_logs

from antdt.agent.settings import AgentSettings
from antdt.runtime.config import ServiceSettings, names_setting, unknown_settings
from antdt.services.runner import settings_class

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SERVICES = ("monitor", "controller", "shards")
# KEY = "value" or KEY: value (HCL, YAML); the value as written, quotes stripped.
SETTING = re.compile(r"^\s*(ANTDT_[A-Z0-9_]+)\s*[=:]\s*\"?([^\"\n]*)\"?\s*$", re.MULTILINE)


def literal(value: str) -> bool:
    """A value written out, not filled in by the deployer (${...}, var.x, a YAML alias)."""
    filled = ("${", "{{")  # compose's and Nomad's substitutions, Nomad's templates
    return not any(f in value for f in filled) and not value.startswith(("var.", "*", "&"))


def nomad_groups() -> dict[str, str]:
    """The jobspec's text by task group."""
    text = (DEPLOY / "antdt.nomad.hcl").read_text()
    parts = re.split(r'^\s*group\s+"(\w+)"\s*\{', text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_nomad_job_runs_each_service_with_its_own_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    groups = nomad_groups()
    assert sorted(groups) == sorted(SERVICES)
    for service, text in groups.items():
        assert f'args  = ["{service}"]' in text
        settings = dict(SETTING.findall(text))
        assert {"ANTDT_NATS__URL", "ANTDT_ETCD__ENDPOINT", "ANTDT_REPLICA_ID"} <= set(settings)
        cls = settings_class(service)
        unknown = [name for name in settings if not names_setting(cls, name)]
        assert not unknown, f"{service}: no such setting {unknown}"
        _accepted(monkeypatch, cls, _stand_ins(settings))


def test_compose_gives_every_service_settings_it_has(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (DEPLOY / "compose.yaml").read_text()
    settings = dict(SETTING.findall(text))
    assert {"ANTDT_NATS__URL", "ANTDT_ETCD__ENDPOINT"} <= set(settings)
    for service in SERVICES:  # one environment, shared by all three
        assert f'command: ["{service}"]' in text
        cls = settings_class(service)
        unknown = [name for name in settings if not names_setting(cls, name)]
        assert not unknown, f"{service}: no such setting {unknown}"
        _accepted(monkeypatch, cls, _stand_ins(settings))


def test_a_misspelt_setting_is_caught() -> None:
    monitor = settings_class("monitor")
    assert names_setting(monitor, "ANTDT_TELEMETRY__METRICS_PORT")
    assert names_setting(monitor, "ANTDT_WINDOW")
    assert not names_setting(monitor, "ANTDT_ETCD__ENDPIONT")
    assert not names_setting(monitor, "ANTDT_NATS__URLS")
    assert not names_setting(monitor, "ANTDT_JOB_RETENTION_S")  # the controller's
    # Through an optional model: the agent's monitoring parameters (documented), which a
    # service's environment may carry too when it is shared with the ranks.
    assert names_setting(AgentSettings, "ANTDT_MONITOR__WINDOW")
    assert not names_setting(AgentSettings, "ANTDT_MONITOR__WINDOWS")
    # What a service process warns of: the services' own settings, an agent's (shard
    # size), the demo's and the launcher's variables pass; the misspelt one does not.
    environ = {
        "ANTDT_ETCD__ENDPIONT": "e:2379",
        "ANTDT_WINDOW": "8",
        "ANTDT_DEMO_OUT": ".",
        "ANTDT_LAUNCH_DIR": "/tmp",
        "PATH": "/bin",
        "ANTDT_SHARD_SIZE": "4",
        "ANTDT_MONITOR__SLOW_THRESHOLD": "0.2",
    }
    roots = [*(settings_class(s) for s in SERVICES), AgentSettings]
    assert unknown_settings(environ, roots) == ["ANTDT_ETCD__ENDPIONT"]


def _accepted(
    monkeypatch: pytest.MonkeyPatch, cls: type[ServiceSettings], values: dict[str, str]
) -> None:
    """The service reads `values` from its environment as written (no validation error),
    each landing on its field."""
    with monkeypatch.context() as env:
        for name, value in values.items():
            env.setenv(name, value)
        settings = cls()
    for name, value in values.items():
        read: object = settings
        for part in name.removeprefix("ANTDT_").lower().split("__"):
            read = getattr(read, part)
        assert _same(read, value), (name, read, value)


def _stand_ins(settings: dict[str, str]) -> dict[str, str]:
    """The settings written out, and a password for each the deployer fills in (a user
    comes with its password)."""
    written = {k: v for k, v in settings.items() if literal(v)}
    filled = {k: "filled-in-0123" for k, v in settings.items() if k.endswith("PASSWORD")}
    return {**written, **{k: v for k, v in filled.items() if k not in written}}


def _same(read: object, written: str) -> bool:
    if isinstance(read, SecretStr):
        return read.get_secret_value() == written
    if written == "null":
        return read is None
    if isinstance(read, bool) or not isinstance(read, int | float):
        return str(read) == written
    return read == float(written)


def test_a_service_process_names_the_variables_it_ignores(monkeypatch: pytest.MonkeyPatch) -> None:
    from antdt.cli.serve import warn_unknown_settings as _warn_unknown_settings

    monkeypatch.setenv("ANTDT_ETCD__ENDPIONT", "etcd:2379")
    monkeypatch.setenv("ANTDT_WINDOW", "8")
    with capture_logs() as logs:
        _warn_unknown_settings()
    [warning] = [entry for entry in logs if entry["event"].endswith("no setting: ignored")]
    assert warning["log_level"] == "warning"
    assert "ANTDT_ETCD__ENDPIONT" in warning["variables"]
    assert "ANTDT_WINDOW" not in warning["variables"]


def compose() -> dict[str, Any]:
    """deploy/compose.yaml read by a real YAML parser (js-yaml, under Node.js), anchors,
    aliases and merge keys resolved."""
    return load_yaml(DEPLOY / "compose.yaml")


def load_yaml(path: Path) -> dict[str, Any]:
    """`path` read by js-yaml under Node.js (`make node` installs it)."""
    from tests.nodejs import NODE_MODULES, ROOT, node

    executable = node()
    if not (NODE_MODULES / "js-yaml" / "package.json").exists():
        pytest.skip("node_modules lacks js-yaml: run `make node` (npm ci) first")
    script = (
        "const y = require('js-yaml'); const fs = require('fs');"
        "process.stdout.write(JSON.stringify(y.load(fs.readFileSync(process.argv[1], 'utf8'))))"
    )
    out = subprocess.run(
        [executable, "-e", script, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    parsed: dict[str, Any] = json.loads(out.stdout)
    return parsed


def test_compose_runs_two_ready_checked_replicas_of_each_service_restarted() -> None:
    services = compose()["services"]
    for name in SERVICES:
        service = services[name]
        assert service["command"] == [name]
        assert service["deploy"]["replicas"] >= 2, name
        # the compose spec's default, but podman-compose starts one replica without it
        assert service["deploy"]["mode"] == "replicated", name
        assert service["restart"] == "unless-stopped", name
        port = service["environment"]["ANTDT_TELEMETRY__METRICS_PORT"]
        probe = " ".join(service["healthcheck"]["test"])
        assert f"http://127.0.0.1:{port}/readyz" in probe, name
        # the container's port alone: each replica gets a host port of its own (a host
        # range is refused by podman-compose, which gives every replica the whole range)
        assert service["ports"] == [port], name
    for server in ("nats-1", "nats-2", "nats-3", "etcd"):
        assert services[server]["healthcheck"]["test"][0] == "CMD", server
        assert services[server]["restart"] == "unless-stopped", server
        if server.startswith("nats"):
            assert "-m" in services[server]["command"]  # the monitor port its check reads
