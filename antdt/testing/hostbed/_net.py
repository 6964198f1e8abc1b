"""The bed's network, made with iproute2 only inside namespaces it created: a switch
namespace holding a bridge, and per host a namespace joined to it by a veth pair.

A slowed link uses `tc netem` on both ends where the kernel has it; elsewhere a small
user-space link (`_userlink.py`, run in the switch namespace) carries the host's frames
between its veth end and a tap on the bridge, each direction delayed and paced."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from antdt.runtime.servers import netns_argv
from antdt.testing.hostbed._names import BRIDGE, HOST_DEV, BedError, BedNames

USERLINK = Path(__file__).with_name("_userlink.py")


def ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    """Run `ip [-n netns] args...`; its stdout, or BedError with its stderr."""
    return _run(["ip", *(["-n", netns] if netns else []), *args], check)


def tc(*args: str, netns: str, check: bool = True) -> str:
    return _run(["tc", "-n", netns, *args], check)


def _run(argv: list[str], check: bool) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise BedError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def tools_missing() -> list[str]:
    return [tool for tool in ("ip", "tc") if shutil.which(tool) is None]


def namespaces() -> list[str]:
    """The names of every network namespace `ip netns` knows."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def netns_pids(netns: str) -> list[int]:
    return [int(pid) for pid in ip("netns", "pids", netns, check=False).split()]


def make_switch(names: BedNames) -> None:
    sw = names.switch_ns
    ip("netns", "add", sw)
    ip("link", "set", "lo", "up", netns=sw)
    ip("link", "add", BRIDGE, "type", "bridge", netns=sw)
    ip("link", "set", BRIDGE, "up", netns=sw)


def make_host(names: BedNames, host: str, address: str, prefixlen: int) -> None:
    """A namespace for `host`, with `lo` up and `eth0` at `address`, plugged into the bridge."""
    ns, sw, port = names.host_ns(host), names.switch_ns, names.switch_port(host)
    ip("netns", "add", ns)
    ip("link", "set", "lo", "up", netns=ns)
    # Both ends are made inside our namespaces: the root namespace never sees them.
    ip("link", "add", port, "type", "veth", "peer", "name", HOST_DEV, "netns", ns, netns=sw)
    ip("link", "set", port, "master", BRIDGE, "up", netns=sw)
    ip("addr", "add", f"{address}/{prefixlen}", "dev", HOST_DEV, netns=ns)
    ip("link", "set", HOST_DEV, "up", netns=ns)


def set_link(names: BedNames, host: str, up: bool) -> None:
    """Cut (down) or reconnect (up) `host`'s link at the switch's end."""
    ip("link", "set", names.switch_port(host), "up" if up else "down", netns=names.switch_ns)


def delete_netns(netns: str) -> None:
    ip("netns", "delete", netns, check=False)


def addresses(subnet: str) -> list[str]:
    return [str(addr) for addr in ipaddress.ip_network(subnet).hosts()]


@dataclass(frozen=True)
class Shaping:
    """What a slowed link does to each direction."""

    delay_ms: float
    jitter_ms: float = 0.0
    rate_mbit: float | None = None

    def netem_args(self) -> list[str]:
        args = ["delay", f"{self.delay_ms}ms"]
        if self.jitter_ms:
            args.append(f"{self.jitter_ms}ms")
        if self.rate_mbit:
            args += ["rate", f"{self.rate_mbit}mbit"]
        return args

    def userlink_args(self) -> list[str]:
        return [str(self.delay_ms), str(self.jitter_ms), str(self.rate_mbit or 0)]


def has_netem(probe_netns: str) -> bool:
    """Whether this kernel has the netem qdisc (probed on a veth in `probe_netns`)."""
    probe = "netemprobe"
    ip("link", "add", probe, "type", "veth", "peer", "name", probe + "b", netns=probe_netns)
    try:
        added = subprocess.run(
            ["tc", "-n", probe_netns, "qdisc", "add", "dev", probe, "root", "netem"],
            capture_output=True,
        )
        return added.returncode == 0
    finally:
        ip("link", "delete", probe, netns=probe_netns, check=False)


def netem(names: BedNames, host: str, shaping: Shaping | None) -> None:
    """Set (or with None remove) netem on both ends of `host`'s link."""
    for netns, dev in ((names.host_ns(host), HOST_DEV), (names.switch_ns, names.switch_port(host))):
        if shaping is None:
            tc("qdisc", "del", "dev", dev, "root", netns=netns, check=False)
        else:
            tc("qdisc", "replace", "dev", dev, "root", "netem", *shaping.netem_args(), netns=netns)


def userlink_argv(names: BedNames, host: str, shaping: Shaping) -> list[str]:
    """The command of the user-space link for `host` (run it, then `splice_userlink`)."""
    return [
        *netns_argv(names.switch_ns),
        sys.executable,
        str(USERLINK),
        names.switch_port(host),
        names.tap(host),
        *shaping.userlink_args(),
    ]


def splice_userlink(names: BedNames, host: str, on: bool) -> None:
    """Put the user-space link's tap on the bridge in place of `host`'s port, or back."""
    sw, port, tap = names.switch_ns, names.switch_port(host), names.tap(host)
    if on:
        ip("link", "set", port, "nomaster", netns=sw)
        ip("link", "set", tap, "master", BRIDGE, "up", netns=sw)
    else:
        ip("link", "set", port, "master", BRIDGE, netns=sw)
