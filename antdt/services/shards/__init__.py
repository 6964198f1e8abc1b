"""Shards: the stateful dynamic data-sharding ledger (pure core in `ledger`; shell in `service`)."""

from antdt.services.shards.ledger import (
    InFlightEntry,
    LedgerState,
    Requeued,
    apply_fetch,
    new_ledger,
    release_rank,
    shard_range,
    status,
)
from antdt.services.shards.permutation import index_of, shard_at

__all__ = [
    "InFlightEntry",
    "LedgerState",
    "Requeued",
    "apply_fetch",
    "index_of",
    "new_ledger",
    "release_rank",
    "shard_at",
    "shard_range",
    "status",
]
