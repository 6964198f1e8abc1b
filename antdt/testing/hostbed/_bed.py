"""The test bed: hosts as network namespaces on one bridge, each with a CPU budget, the
processes started in them, and the faults a test injects (CPU contention, a slow or cut
link). Everything it made is removed when it closes, however the test ends."""

from __future__ import annotations

import atexit
import contextlib
import enum
import ipaddress
import math
import os
import signal
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import structlog

from antdt.runtime import cpubudget as _cgroup
from antdt.runtime.cpubudget import busy_argv
from antdt.runtime.servers import EmbeddedEtcd, EmbeddedNats, die_with_parent, in_netns
from antdt.runtime.servers import netns_argv as _netns_argv
from antdt.testing.hostbed import _net
from antdt.testing.hostbed._names import BedError, BedNames
from antdt.testing.hostbed._sweep import kill_netns, sweep_stale

T = TypeVar("T")
log = structlog.get_logger("antdt.hostbed")
_OPEN: weakref.WeakSet[HostBed] = weakref.WeakSet()


class BedState(enum.Enum):
    """A bed's lifecycle: NEW --open()--> OPEN --close()--> CLOSED (close is idempotent,
    and also runs from NEW, at exit, and on SIGTERM)."""

    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


@dataclass
class Host:
    """One host: its namespace, address and CPU budget, and the state of its link."""

    name: str
    netns: str
    address: str
    budget: _cgroup.CpuBudget
    shaping: _net.Shaping | None = None
    connected: bool = True
    userlink: subprocess.Popen[str] | None = field(default=None, repr=False)


@dataclass
class Servers:
    """nats-server and etcd running in one host, bound to its address."""

    nats: EmbeddedNats
    etcd: EmbeddedEtcd

    @property
    def nats_url(self) -> str:
        return self.nats.url

    @property
    def etcd_endpoint(self) -> str:
        return self.etcd.endpoint


class HostBed:
    """Hosts on one machine for tests: `with HostBed() as bed: w = bed.add_host("w0", cpus=1)`.

    Needs root and iproute2. `link_shaper` says how slow links are made ("netem", or
    "userspace" where the kernel lacks netem); `cpu_limit` how budgets are enforced."""

    def __init__(self, prefix: str = "antdt", subnet: str = "10.213.0.0/24") -> None:
        self.names = BedNames.new(prefix, os.getpid())
        self.subnet = ipaddress.ip_network(subnet)
        self.hosts: dict[str, Host] = {}
        self.state = BedState.NEW
        self.cpu_limit, self._cgroup_parent = _cgroup.detect()
        self.link_shaper = ""
        self._free_addresses = _net.addresses(subnet)
        self._procs: list[subprocess.Popen[Any]] = []
        self._servers: list[Servers] = []
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._lock = threading.RLock()

    # -- lifecycle

    def open(self) -> HostBed:
        if missing := _net.tools_missing():
            raise BedError(f"{', '.join(missing)} missing: install iproute2 (make hosttools)")
        sweep_stale(self.names.prefix)
        _OPEN.add(self)
        _install_exit_hooks()
        self.state = BedState.OPEN
        try:
            _net.make_switch(self.names)
            self.link_shaper = "netem" if _net.has_netem(self.names.switch_ns) else "userspace"
        except BaseException:
            self.close()
            raise
        if self.link_shaper == "userspace":
            log.info("kernel lacks netem: slow links are shaped in user space")
        return self

    def close(self) -> None:
        """Kill every process in the bed's hosts, delete its namespaces and cgroups."""
        with self._lock:
            if self.state is BedState.CLOSED:
                return
            self.state = BedState.CLOSED
            _OPEN.discard(self)
            for proc in self._procs:
                _kill_group(proc)
            for host in self.hosts.values():
                kill_netns(host.netns)
            kill_netns(self.names.switch_ns)
            for host in self.hosts.values():
                host.budget.remove()
            for proc in self._procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
                for pipe in (proc.stdin, proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()
            for servers in self._servers:
                servers.nats.kill()
                servers.etcd.kill()
            if self._tmp is not None:
                self._tmp.cleanup()

    def remains(self) -> list[str]:
        """The bed's namespaces that exist now (once closed: what it left behind)."""
        return [n for n in _net.namespaces() if n.startswith(f"{self.names.base}-")]

    def __enter__(self) -> HostBed:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- hosts and processes

    def add_host(self, name: str, *, cpus: float | None = None) -> Host:
        """A new host with the next free address, and `cpus` CPUs' worth of time (None:
        no limit of its own)."""
        self._require_open()
        netns = self.names.host_ns(name)
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists")
        budget = _cgroup.CpuBudget(
            netns, cpus, self.cpu_limit, self._cgroup_parent, core=len(self.hosts)
        )
        host = Host(name, netns, self._free_addresses.pop(0), budget)
        self.hosts[name] = host
        _net.make_host(self.names, name, host.address, self.subnet.prefixlen)
        budget.create()
        return host

    def popen(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        **popen_kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start `argv` in `host` (its namespace and CPU budget) in a process group of its
        own that dies with this process; `env` is added to this process's environment."""
        self._require_open()
        budget = host.budget

        def enter_host() -> None:
            die_with_parent()
            budget.join_self()

        proc = subprocess.Popen(
            [*_netns_argv(host.netns), *argv],
            env={**os.environ, **(env or {})},
            start_new_session=True,
            preexec_fn=enter_host,
            **popen_kwargs,
        )
        with self._lock:
            self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[Any], timeout: float = 5.0) -> int:
        """Kill `proc`'s process group and reap it; its exit status."""
        _kill_group(proc)
        return proc.wait(timeout)

    def call(self, host: Host, fn: Callable[[], T]) -> T:
        """`fn()` in a thread inside `host`'s namespace: sockets it makes live there."""
        return in_netns(host.netns, fn)

    def start_servers(self, host: Host, data_dir: Path | None = None) -> Servers:
        """nats-server (JetStream) and etcd in `host`, bound to its address, stopped when
        the bed closes."""
        self._require_open()
        root = data_dir or self._tmpdir() / f"servers-{host.name}"
        etcd = EmbeddedEtcd(root / "etcd", host=host.address, netns=host.netns).start()
        servers = Servers(EmbeddedNats(root / "nats", host=host.address, netns=host.netns), etcd)
        self._servers.append(servers)
        servers.nats.start()
        for pid in (etcd.pid, servers.nats.pid):
            if pid is not None:
                host.budget.add(pid)
        return servers

    # -- faults

    def contend(self, host: Host, share: float = 1.0, *, max_s: float = 600.0) -> list[Any]:
        """Real competing CPU work in `host`'s budget: `share` CPUs' worth of busy loops
        (1.5: one always busy, one busy half the time), running when this returns. Stop
        them with `stop`, or let the bed's close do it."""
        if share <= 0:
            raise ValueError("share must be > 0")
        duties = [1.0] * math.floor(share) + ([share % 1.0] if share % 1.0 > 1e-6 else [])
        started = []
        for duty in duties:
            proc = self.popen(
                host, busy_argv(None, max_s=max_s, duty=duty), stdout=subprocess.PIPE, text=True
            )
            started.append(proc)
            if proc.stdout is None or proc.stdout.readline().strip() != "ready":
                raise BedError(f"contention in {host.name} did not start")
        return started

    def slow_link(
        self,
        host: Host,
        delay_ms: float,
        *,
        rate_mbit: float | None = None,
        jitter_ms: float = 0.0,
    ) -> None:
        """Delay each direction of `host`'s link by `delay_ms` (round trip +2x), +-
        `jitter_ms`, and cap it at `rate_mbit`; replaces an earlier slowing."""
        self._require_open()
        shaping = _net.Shaping(delay_ms, jitter_ms, rate_mbit)
        if self.link_shaper == "netem":
            _net.netem(self.names, host.name, shaping)
        else:
            self._stop_userlink(host)
            host.userlink = self._start_userlink(host, shaping)
        host.shaping = shaping

    def heal_link(self, host: Host) -> None:
        """Give `host` its full-speed link back."""
        if self.link_shaper == "netem":
            _net.netem(self.names, host.name, None)
        else:
            self._stop_userlink(host)
        host.shaping = None

    def cut(self, host: Host) -> None:
        """Disconnect `host` from the switch (link down): its traffic is lost."""
        _net.set_link(self.names, host.name, up=False)
        host.connected = False

    def reconnect(self, host: Host) -> None:
        _net.set_link(self.names, host.name, up=True)
        host.connected = True

    # -- internals

    def _start_userlink(self, host: Host, shaping: _net.Shaping) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            _net.userlink_argv(self.names, host.name, shaping),
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        with self._lock:
            self._procs.append(proc)
        if proc.stdout is None or proc.stdout.readline().strip() != "ready":
            _kill_group(proc)
            raise BedError(f"the user-space link of {host.name} did not start")
        _net.splice_userlink(self.names, host.name, on=True)
        return proc

    def _stop_userlink(self, host: Host) -> None:
        if host.userlink is None:
            return
        self.stop(host.userlink)
        host.userlink = None
        _net.splice_userlink(self.names, host.name, on=False)

    def _tmpdir(self) -> Path:
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"{self.names.base}-")
        return Path(self._tmp.name)

    def _require_open(self) -> None:
        if self.state is not BedState.OPEN:
            raise BedError(f"the bed is {self.state.value}, not open")


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _close_all() -> None:
    for bed in list(_OPEN):
        bed.close()


_hooks_installed = False


def _install_exit_hooks() -> None:
    """Close open beds at exit, and turn a SIGTERM (left at its default) into SystemExit so
    `with` blocks unwind; a SIGKILL's leftovers go to the next bed's `sweep_stale`."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_close_all)
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
