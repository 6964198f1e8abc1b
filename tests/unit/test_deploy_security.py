"""The deployments with security on, read by real parsers: compose (js-yaml), the Nomad
job (python-hcl2), nats.conf (nats-server's own configuration check), the Prometheus
scrape configuration and the Grafana dashboard (js-yaml, json). Each service logs in as
its own role over TLS to both servers, streams are replicated on a three-node NATS
cluster, and the dashboard queries only metrics that AntDT exports."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from antdt.runtime.servers.embedded import find_nats_server
from antdt.runtime.servers.natsconf import authorization_block, load_permissions
from antdt.schemas import DEFAULT_KEY_PREFIX
from antdt.testing import make_pki
from tests.unit.test_deploy import DEPLOY, SERVICES, compose, load_yaml

NATS_NODES = ("nats-1", "nats-2", "nats-3")
TLS_KEYS = ("CA", "CERT", "KEY")


def test_compose_runs_a_replicated_nats_cluster_with_users_and_tls() -> None:
    services = compose()["services"]
    for node in NATS_NODES:
        command = services[node]["command"]
        routes = command[command.index("--routes") + 1].split(",")
        assert routes == [f"nats://{n}:6222" for n in NATS_NODES], node
        assert command[command.index("--server_name") + 1] == node
        mounts = {m.split(":")[1]: m.split(":")[0] for m in services[node]["volumes"]}
        assert mounts["/etc/nats/antdt.conf"] == "./nats.conf"
        assert mounts["/etc/nats/auth.conf"] == "./secrets/nats-auth.conf"
        assert mounts["/etc/nats/certs"] == "./secrets/certs"
    etcd = services["etcd"]["command"]
    assert "--client-cert-auth" in etcd and "--listen-client-urls=https://0.0.0.0:2379" in etcd


def test_each_service_logs_in_as_its_own_user_over_tls_to_both_servers() -> None:
    services = compose()["services"]
    for name in SERVICES:
        env, service = services[name]["environment"], services[name]
        urls = env["ANTDT_NATS__URL"].split(",")
        assert urls == [f"nats://{n}:4222" for n in NATS_NODES], name
        assert int(env["ANTDT_NATS__STREAM_REPLICAS"]) == len(NATS_NODES)
        password = f"${{ANTDT_{name.upper()}_PASSWORD:?"
        for server in ("NATS", "ETCD"):
            assert env[f"ANTDT_{server}__USER"] == name, (name, server)
            assert env[f"ANTDT_{server}__PASSWORD"].startswith(password), (name, server)
            [mount] = service["volumes"]
            source, target = mount.split(":")[:2]
            assert source == "./secrets/certs"
            for key in TLS_KEYS:
                assert env[f"ANTDT_{server}__TLS__{key}"].startswith(target + "/"), (name, key)
        assert set(NATS_NODES) <= set(service["depends_on"])


def test_compose_makes_the_etcd_users_of_the_services_limited_to_the_prefix() -> None:
    setup = compose()["services"]["etcd-users"]
    script = setup["command"][0]
    for name in SERVICES:
        assert f'add {name} "$${name.upper()}_PASSWORD"' in script
        assert setup["environment"][f"{name.upper()}_PASSWORD"].startswith(
            f"${{ANTDT_{name.upper()}_PASSWORD:?"
        )
    assert f"--prefix=true readwrite {DEFAULT_KEY_PREFIX}" in script
    assert script.rstrip().endswith("auth enable")


def test_nats_conf_is_valid_for_nats_server_with_generated_users_and_certificates(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path / "pki")
    text = (DEPLOY / "nats.conf").read_text()
    for name, path in (("server.pem", pki.server_cert), ("server.key", pki.server_key)):
        text = text.replace(f"/etc/nats/certs/{name}", str(path))
    text = text.replace("/etc/nats/certs/ca.pem", str(pki.ca))
    assert "/etc/nats/certs/" not in text, "nats.conf names a certificate compose lacks"
    (tmp_path / "antdt.conf").write_text(text)
    users = [{"user": s, "password": f"pw-{s}-0123", "role": s} for s in SERVICES]
    (tmp_path / "permissions.json").write_text(json.dumps({"users": users}))
    auth = authorization_block(load_permissions(tmp_path / "permissions.json"))
    (tmp_path / "auth.conf").write_text(auth)
    checked = subprocess.run(
        [find_nats_server(), "-t", "-c", str(tmp_path / "antdt.conf")],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert 'include "auth.conf"' in (DEPLOY / "nats.conf").read_text()


def _unquoted(value: Any) -> Any:
    return value.strip('"') if isinstance(value, str) else value


def _nomad() -> dict[str, Any]:
    hcl2 = pytest.importorskip("hcl2", reason="python-hcl2 (the dev extra) is not installed")
    with (DEPLOY / "antdt.nomad.hcl").open() as f:
        parsed: dict[str, Any] = hcl2.load(f)
    return parsed


def test_the_nomad_job_logs_each_service_in_with_its_user_and_certificates() -> None:
    parsed = _nomad()
    variables = {_unquoted(k): v for each in parsed["variable"] for k, v in each.items()}
    assert variables["stream_replicas"]["default"] == 3
    [job] = [each['"antdt"'] for each in parsed["job"]]
    groups = {_unquoted(k): v for each in job["group"] for k, v in each.items()}
    assert sorted(groups) == sorted(SERVICES)
    for name, group in groups.items():
        [check] = group["service"][0]["check"]
        assert _unquoted(check["path"]) == "/readyz", name
        [task] = [t[f'"{name}"'] for t in group["task"]]
        env = {k: _unquoted(v) for k, v in task["env"][0].items() if k != "__comments__"}
        assert env["ANTDT_NATS__STREAM_REPLICAS"] == "${var.stream_replicas}"
        [users] = task["template"]
        assert f'nomadVar \\"nomad/jobs/antdt/{name}\\"' in users["data"].replace('"', '\\"')
        assert "ANTDT_NATS__PASSWORD=" in users["data"] and users["env"] is True
        [files] = [d['"template"'] for d in task["dynamic"]]
        written = {_unquoted(k) for k in files["for_each"]}
        for server in ("NATS", "ETCD"):
            assert env[f"ANTDT_{server}__USER"] == name
            for key in TLS_KEYS:
                path = env[f"ANTDT_{server}__TLS__{key}"]
                assert path.removeprefix("${NOMAD_SECRETS_DIR}/") in written, (name, path)


def test_prometheus_scrapes_every_replica_on_the_metrics_port() -> None:
    config = load_yaml(DEPLOY / "prometheus.yml")
    services = compose()["services"]
    [dns] = next(c for c in config["scrape_configs"] if c["job_name"] == "antdt")["dns_sd_configs"]
    assert sorted(dns["names"]) == sorted(SERVICES)
    for name in SERVICES:
        port = services[name]["environment"]["ANTDT_TELEMETRY__METRICS_PORT"]
        assert dns["port"] == int(port), name
    mounts = services["prometheus"]["volumes"]
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts


class _RecordingMeter:
    """An OpenTelemetry meter that records which instruments are created."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str, str]] = []  # (kind, name, unit)

    def __getattr__(self, method: str) -> Any:
        kind = method.removeprefix("create_")

        def create(name: str, *args: Any, unit: str = "", **kwargs: Any) -> object:
            self.made.append((kind, name, unit))
            return self

        return create

    def add(self, *args: Any) -> None: ...


def _exported_names(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The Prometheus names of every AntDT instrument (the exporter's naming: dots to
    underscores, the unit's suffix, counters' _total, histograms' series)."""
    from antdt.runtime.telemetry import metrics as antdt_metrics

    meter = _RecordingMeter()
    monkeypatch.setattr(antdt_metrics.metrics, "get_meter", lambda *a, **k: meter)
    antdt_metrics._Instruments()
    names = set()
    for kind, name, unit in meter.made:
        base = name.replace(".", "_")
        base += (
            "_per_second"
            if unit.endswith("/s")
            else {"s": "_seconds", "By": "_bytes"}.get(unit, "")
        )
        if "counter" in kind and "up_down" not in kind:
            base += "_total"
        series = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
        names |= {base + s for s in series}
    return names


def _metric_names(expr: str) -> set[str]:
    """The AntDT metrics a PromQL expression reads (its label lists and selectors cut)."""
    expr = re.sub(r"\b(by|without|ignoring|on)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    return set(re.findall(r"\bantdt_\w+", expr))


def test_the_grafana_dashboard_queries_only_metrics_antdt_exports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exported = _exported_names(monkeypatch)
    assert {"antdt_incidents_total", "antdt_monitor_backlog_bytes"} <= exported  # as documented
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "antdt.json").read_text())
    datasource = load_yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")
    [source] = datasource["datasources"]
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    queried = set()
    for panel in panels:
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            queried |= _metric_names(target["expr"])
    assert queried and queried <= exported, sorted(queried - exported)
    templated = dashboard["templating"]["list"][0]["query"]
    assert re.search(r"label_values\((\w+)", templated).group(1) in exported  # type: ignore[union-attr]
