"""What the etcd seam's calls take and return, and the errors they raise: no aetcd here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


class StoreError(RuntimeError):
    """etcd refused the call, or could not be reached (StoreUnavailable)."""


class HistoryCompacted(StoreError):
    """A watch asked for changes from a revision etcd has compacted away."""

    def __init__(self, prefix: str, revision: int | None) -> None:
        super().__init__(f"changes under {prefix!r} from revision {revision} were compacted")


class StoreUnavailable(StoreError):
    """etcd could not be reached, or did not answer in time: worth retrying."""


@dataclass(frozen=True)
class Versioned:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    version: int
    lease: int


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction. `mod_revision == 0` / `create_revision == 0`
    mean the key does not exist."""

    key: str
    target: Literal["mod", "create", "version", "value"]
    value: int | bytes
    op: Literal["==", "!=", "<", ">"] = "=="

    @classmethod
    def mod_is(cls, key: str, revision: int) -> Compare:
        return cls(key, "mod", revision)

    @classmethod
    def absent(cls, key: str) -> Compare:
        return cls(key, "create", 0)

    @classmethod
    def value_is(cls, key: str, value: bytes) -> Compare:
        return cls(key, "value", value)


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease: int | None = None


@dataclass(frozen=True)
class Delete:
    key: str
    prefix: bool = False


@dataclass(frozen=True)
class Get:
    key: str


Op = Put | Delete | Get


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    gets: list[Versioned | None] = field(default_factory=list)


@dataclass(frozen=True)
class WatchEvent:
    kind: Literal["put", "delete"]
    key: str
    value: bytes
    mod_revision: int
