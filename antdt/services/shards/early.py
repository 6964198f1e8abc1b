"""When a fetch reply may go out before its change is durable (write-behind): when every
shard it delivers was already granted to that rank, with that attempt, in the ledger as
stored. Handing out must be durable before a rank trains on it; done marks need not be
(the rank reports them again until a reply says they are durable, `unconfirmed`)."""

from __future__ import annotations

from typing import NamedTuple

from antdt.schemas import ShardRef, ShardReply, replaced
from antdt.services.shards.inflight import InFlightTable
from antdt.services.shards.state import LedgerState


class Early(NamedTuple):
    """What a fetch reply delivers from reservations, and the done refs it reported
    (immutable; a NamedTuple, as each fetch builds one: a frozen dataclass costs twice)."""

    rank: int
    epoch: int
    incarnation: int
    deliveries: tuple[tuple[int, int], ...]  # (shard, attempt)
    done: tuple[ShardRef, ...]


class Stored:
    """The ledger as stored, for early-reply checks: its epoch and who holds what (its
    InFlightTable is already indexed by shard: nothing to build per write)."""

    __slots__ = ("epoch", "in_flight", "incarnation")

    def __init__(self, state: LedgerState) -> None:
        self.epoch = state.epoch
        self.incarnation = state.incarnation
        self.in_flight = InFlightTable.of(state.in_flight)

    def holder(self, shard: int) -> tuple[int, int] | None:
        """(rank, attempt) of the stored grant of `shard`, if it is in flight."""
        entry = self.in_flight.get(shard)
        return None if entry is None else (entry.rank, entry.attempt)


def early_reply(reply: ShardReply, early: Early, stored: Stored) -> ShardReply | None:
    """The reply to send before the write, or None: it must wait for the write."""
    if (early.epoch, early.incarnation) != (stored.epoch, stored.incarnation):
        return None
    for shard, attempt in early.deliveries:
        if stored.holder(shard) != (early.rank, attempt):
            return None
    unconfirmed = tuple([ref for ref in early.done if _open(ref, early.rank, stored)])
    return replaced(reply, {"unconfirmed": unconfirmed}) if unconfirmed else reply


def _open(ref: ShardRef, rank: int, stored: Stored) -> bool:
    """Is this done ref not yet durable? Still in flight for the rank as stored, or of
    an epoch the stored ledger has not reached."""
    if ref.epoch != stored.epoch:
        return ref.epoch > stored.epoch
    return stored.holder(ref.shard) == (rank, ref.attempt)
