"""A ledger operation's outcome, as data: what the committer writes and answers. Every
operation is a pure `LedgerState -> LedgerChange`; one that answers an ErrorReply changes
nothing. No I/O here, so the pure ledger modules may build changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from pydantic import BaseModel

from antdt.schemas import ErrorReply
from antdt.services.shards.early import Early
from antdt.services.shards.ledger import LedgerState


class LedgerChange(NamedTuple):
    """One operation's outcome (immutable; a NamedTuple, as every request builds one)."""

    state: LedgerState  # the new state (may be the same object: no write)
    reply: BaseModel | ErrorReply  # what to answer once durable
    puts: tuple[tuple[str, bytes], ...] = ()  # extra etcd keys (full keys) written in the same txn
    deletes: tuple[str, ...] = ()  # extra etcd keys deleted in the same txn
    early: Early | None = None  # the reply may go before the write if this holds (early.py)
    reserved: int = 0  # shards granted ahead of need: their write should come soon

    @property
    def rejected(self) -> bool:
        return isinstance(self.reply, ErrorReply)


#: An operation on one job's ledger. Pure: it may run several times (after a conflict
#: with another replica it is re-applied to the reloaded state), and only the run that
#: becomes durable is answered.
Operation = Callable[[LedgerState], LedgerChange]


class Writes:
    """The extra keys of a batch, merged in operation order: a later put or delete of
    the same key wins (etcd refuses a transaction that names a key twice)."""

    def __init__(self) -> None:
        self._by_key: dict[str, bytes | None] = {}  # None: delete

    def add(self, change: LedgerChange) -> None:
        for key, value in change.puts:
            self._by_key[key] = value
        for key in change.deletes:
            self._by_key[key] = None

    def __len__(self) -> int:
        return len(self._by_key)

    def puts(self) -> list[tuple[str, bytes]]:
        return [(k, v) for k, v in self._by_key.items() if v is not None]

    def deletes(self) -> list[str]:
        return [k for k, v in self._by_key.items() if v is None]
