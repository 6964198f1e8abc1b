"""Settings shared by every process. Each process builds ONE root (a subclass of
`ServiceSettings`, or the agent's own) from the environment (prefix `ANTDT_`, nested
fields with `__`, e.g. `ANTDT_NATS__URL`) and passes it down; nothing reads it globally."""

from __future__ import annotations

import os
import socket
import ssl
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, PositiveInt, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from antdt.runtime.loops import LOOP_KIND_HELP, LoopKind
from antdt.runtime.process import SERVICE_GC_THRESHOLDS
from antdt.schemas import DEFAULT_KEY_PREFIX, DEFAULT_SUBJECT_PREFIX, route_token


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class TlsSettings(BaseModel):
    """A client's TLS: the CA that signed the server's certificate (None: plaintext), and
    this client's own certificate and key where the server asks for one."""

    ca: Path | None = Field(default=None, description="CA bundle (PEM) to verify the server")
    cert: Path | None = Field(default=None, description="Client certificate (PEM)")
    key: Path | None = Field(default=None, description="Client private key (PEM)")

    @model_validator(mode="after")
    def _complete(self) -> TlsSettings:
        if (self.cert is None) != (self.key is None):
            raise ValueError("tls: a client certificate needs its key, and a key its certificate")
        if self.cert is not None and self.ca is None:
            raise ValueError("tls: a client certificate needs the server's CA (tls.ca)")
        return self

    @property
    def enabled(self) -> bool:
        return self.ca is not None

    def expired_cert(self, now: float) -> str | None:
        """Why the client certificate is no good at `now` (it has expired), in words;
        None if it is current, absent or unreadable (the TLS setup then says why). A
        server only answers a bad certificate: the client itself reads the dates."""
        if self.cert is None:
            return None
        try:  # the ssl module's own PEM reader: the standard library has no public one
            not_after = ssl._ssl._test_decode_cert(str(self.cert))["notAfter"]  # type: ignore[attr-defined]
            expires = ssl.cert_time_to_seconds(not_after)
        except (OSError, ValueError, KeyError, ssl.SSLError):
            return None
        return (
            f"the client certificate {self.cert} expired on {not_after}" if expires < now else None
        )


class NatsSettings(BaseModel):
    url: str = Field(
        default="nats://127.0.0.1:4222",
        description="NATS server URLs, comma-separated (a cluster's: any of them will do)",
    )
    subject_prefix: str = Field(
        default=DEFAULT_SUBJECT_PREFIX, description="Prefix of every subject"
    )
    connect_timeout_s: float = Field(
        default=2.0, gt=0, description="Per-attempt connect timeout, seconds"
    )
    reconnect_wait_s: float = Field(
        default=0.2, gt=0, description="Pause between reconnects, seconds"
    )
    request_timeout_s: float = Field(
        default=2.0, gt=0, description="Default request/reply timeout, seconds"
    )
    ping_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="Client PING interval, seconds: a server gone without closing the "
        "connection (host lost, network cut) is left after max_outstanding_pings of them "
        "go unanswered, about 15-20 s by default (nats-py's own: 4-6 min)",
    )
    max_outstanding_pings: int = Field(
        default=3, ge=1, le=100, description="Unanswered PINGs before reconnecting, pings"
    )
    backoff_max_s: float = Field(
        default=2.0, gt=0, description="Longest pause between tries at a first connection, s"
    )
    stream_replicas: int = Field(
        default=1, ge=1, le=5, description="Replicas of each JetStream stream (3 on a cluster)"
    )
    max_pending_bytes: int = Field(
        default=64 * 1024 * 1024, gt=0, description="Outgoing buffer kept while disconnected, bytes"
    )
    require_reply_type: bool = Field(
        # From the environment even where the settings are built in code (tests).
        default_factory=lambda: _truthy(os.environ.get("ANTDT_NATS__REQUIRE_REPLY_TYPE")),
        description="Refuse a reply without its Antdt-Reply header (a service older than "
        "typed replies answers without one); the test suite turns it on",
    )
    user: str | None = Field(
        default=None, description="NATS user name (its role's permissions); None: no auth"
    )
    password: SecretStr | None = Field(default=None, description="Password of `user`")
    tls: TlsSettings = Field(default_factory=TlsSettings, description="TLS to nats-server")

    @property
    def inbox_prefix(self) -> str:
        """Where replies to this connection's requests arrive: the user's own inboxes."""
        return inbox_prefix(self.user)


def inbox_prefix(user: str | None) -> str:
    """The reply-subject prefix of a connection as `user` (the one nats-server's
    permissions let it subscribe to); `_INBOX` without a user."""
    return f"_INBOX.{route_token(user)}" if user else "_INBOX"


class EtcdSettings(BaseModel):
    endpoint: str = Field(
        default="127.0.0.1:2379",
        description="etcd client endpoints host:port, comma-separated (a cluster's members)",
    )
    key_prefix: str = Field(default=DEFAULT_KEY_PREFIX, description="Prefix of every key")
    timeout_s: float = Field(default=5.0, gt=0, description="Per-call timeout, seconds")
    lease_ttl_s: int = Field(default=5, ge=2, description="TTL of ownership leases, seconds")
    backoff_max_s: float = Field(
        default=2.0, gt=0, description="Longest pause between tries at a first connection, s"
    )
    user: str | None = Field(default=None, description="etcd user; None: etcd without auth")
    password: SecretStr | None = Field(default=None, description="Password of `user`")
    tls: TlsSettings = Field(default_factory=TlsSettings, description="TLS to etcd")

    @model_validator(mode="after")
    def _credentials_in_pairs(self) -> EtcdSettings:
        if (self.user is None) != (self.password is None):
            raise ValueError("etcd: a user needs its password, and a password its user")
        return self


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _env(*names: str) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


class TelemetrySettings(BaseModel):
    otlp_endpoint: str | None = Field(
        default_factory=lambda: _env(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"
        ),
        description="OTLP endpoint for spans (grpc host:port, or an http(s) URL; "
        "default OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT); None: no export",
    )
    log_format: str = Field(default="auto", description="auto (console on a tty), json or console")
    log_level: str = Field(default="info", description="debug, info, warning, error")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="Serve Prometheus /metrics on this port"
    )
    metrics_host: str = Field(default="0.0.0.0", description="Address of the /metrics server")
    metrics_otlp_endpoint: str | None = Field(
        default_factory=lambda: _env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
        description="OTLP endpoint for metrics (default OTEL_EXPORTER_OTLP_METRICS_ENDPOINT; "
        "not the traces one: Jaeger takes no metrics); None: no OTLP metrics",
    )
    metrics_interval_s: float = Field(
        default=15.0, gt=0, description="Period of OTLP metric export, seconds"
    )
    effect_steps: int = Field(
        default=16,
        ge=1,
        description="Steps after a plan's effective step at which the "
        "controller measures its effect (span `effect`): >= 2 monitor windows",
    )


class RecordingSettings(BaseModel):
    """Bounded JetStream streams that keep step events and JobHealth for after-the-fact
    reports (`antdt report`). Each stream drops its oldest messages past either limit."""

    enabled: bool = Field(default=True, description="Ensure the recording streams on start")
    steps_max_age_s: float = Field(
        default=3 * 86400, gt=0, description="ANTDT_STEPS: keep step events this long, seconds"
    )
    steps_max_bytes: int = Field(
        default=1024 * 1024 * 1024, gt=0, description="ANTDT_STEPS: size cap, bytes"
    )
    health_max_age_s: float = Field(
        default=3 * 86400, gt=0, description="ANTDT_HEALTH: keep JobHealth this long, seconds"
    )
    health_max_bytes: int = Field(
        default=256 * 1024 * 1024, gt=0, description="ANTDT_HEALTH: size cap, bytes"
    )


class ServiceSettings(BaseSettings):
    """The root settings of a control-plane service process."""

    model_config = SettingsConfigDict(
        env_prefix="ANTDT_", env_nested_delimiter="__", extra="ignore", env_parse_none_str="null"
    )

    nats: NatsSettings = Field(default_factory=NatsSettings)
    etcd: EtcdSettings = Field(default_factory=EtcdSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    recording: RecordingSettings = Field(default_factory=RecordingSettings)
    replica_id: str = Field(
        default_factory=default_replica_id, description="Unique name of this service replica"
    )
    wait_for_servers_s: float | None = Field(
        default=None,
        gt=0,
        description="How long to wait for NATS and etcd at start, seconds (with backoff; "
        "null: as long as it takes, so that services may start before their servers)",
    )
    event_loop: LoopKind = Field(default="auto", description=LOOP_KIND_HELP)
    gc_thresholds: tuple[PositiveInt, PositiveInt, PositiveInt] | None = Field(
        default=SERVICE_GC_THRESHOLDS,
        description="Python's garbage-collector thresholds for the process (allocations, "
        "then collections, then collections; JSON, e.g. [700,10,10]); null: Python's "
        "own. Higher than Python's default: see antdt/runtime/process.py",
    )


#: `ANTDT_*` variables that are not settings: the launcher's hand-off to its ranks, and
#: the demo's own knobs.
NOT_SETTINGS = ("ANTDT_LAUNCH_DIR", "ANTDT_DEMO_")


def names_setting(root: type[BaseModel], variable: str) -> bool:
    """Does `variable` (`ANTDT_A__B`) name a field of the settings `root` (`a.b`)? A
    field that is a mapping takes any key below it."""
    model: type[BaseModel] | None = root
    for part in variable.removeprefix("ANTDT_").lower().split("__"):
        if model is None or part not in model.model_fields:
            return False
        model, mapping = _nested(model.model_fields[part].annotation)
        if mapping:
            return True
    return True


def _nested(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model a settings field nests, if any, looking through an optional one
    (`MonitorParams | None`: the agent's `ANTDT_MONITOR__WINDOW`); and whether the field
    is a mapping (its keys are the user's)."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    for member in typing.get_args(annotation) if union else (annotation,):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member, False
        if typing.get_origin(member) in (dict, Mapping) or member is dict:
            return None, True
    return None, False


def unknown_settings(environ: Mapping[str, str], roots: Iterable[type[BaseModel]]) -> list[str]:
    """The `ANTDT_*` variables of `environ` that name no field of any of `roots`, sorted.
    Settings ignore them (an agent's and a service's share the prefix), so a misspelt
    one (`ANTDT_ETCD__ENDPIONT`) would otherwise be dropped without a word."""
    roots = list(roots)
    return sorted(
        name
        for name in environ
        if name.startswith("ANTDT_")
        and not name.startswith(NOT_SETTINGS)
        and not any(names_setting(root, name) for root in roots)
    )
