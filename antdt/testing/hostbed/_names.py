"""The names a test bed gives what it makes: pure, so parallel beds never collide and a
sweep can tell a crashed run's leftovers (creator pid gone) from a live bed's.

A bed's base is `<prefix>-<creator pid>-<token>`; its namespaces are `<base>-<host>` and
`<base>--switch`, its cgroups the same names. Interface names live inside the bed's own
namespaces, so they only need to be unique there (and at most 15 characters)."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,11}$")
HOST_RE = re.compile(r"^[a-z][a-z0-9]{0,10}$")
#: The host's end of its link, inside the host's namespace.
HOST_DEV = "eth0"
#: The bridge, inside the switch namespace.
BRIDGE = "br0"


class BedError(RuntimeError):
    """The bed could not make, change or remove what it was asked to."""


@dataclass(frozen=True)
class BedNames:
    prefix: str
    creator: int
    token: str

    @classmethod
    def new(cls, prefix: str, creator: int) -> BedNames:
        if not PREFIX_RE.match(prefix):
            raise ValueError(f"prefix {prefix!r}: lower-case letters and digits, 1-12")
        return cls(prefix, creator, secrets.token_hex(3))

    @property
    def base(self) -> str:
        return f"{self.prefix}-{self.creator}-{self.token}"

    @property
    def switch_ns(self) -> str:
        return f"{self.base}--switch"

    def host_ns(self, host: str) -> str:
        if not HOST_RE.match(host):
            raise ValueError(f"host {host!r}: lower-case letters and digits, 1-11")
        return f"{self.base}-{host}"

    @staticmethod
    def switch_port(host: str) -> str:
        """The switch's end of `host`'s link (in the switch namespace)."""
        return f"p-{host}"

    @staticmethod
    def tap(host: str) -> str:
        """The user-space link's device for `host` (in the switch namespace)."""
        return f"t-{host}"


def creator_of(name: str, prefix: str) -> int | None:
    """The creator pid of a namespace or cgroup named by a bed with `prefix`, else None."""
    parts = name.split("-")
    if len(parts) < 4 or parts[0] != prefix or not parts[1].isdigit():
        return None
    return int(parts[1])
