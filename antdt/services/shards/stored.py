"""The committer's store: what it asks of one (`LedgerStore`), and ledgers in etcd, one
key per job's ledger (JSON) written by compare-and-swap (`EtcdLedgers`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from antdt.runtime.bus import Rejected
from antdt.runtime.store import Compare, Delete, Get, Op, Put, Store, Versioned, decode_stored
from antdt.schemas import ErrorCode, JobSpec, Keys
from antdt.services.shards.change import Writes
from antdt.services.shards.ledger import LedgerState, new_ledger
from antdt.services.shards.ops import encode


@dataclass(frozen=True)
class Snapshot:
    """A ledger as stored, with the store's compare-and-swap token for it."""

    state: LedgerState
    token: Any


@dataclass(frozen=True)
class Committed:
    """A commit's outcome: `ok` and the new snapshot, or a conflict and the snapshot the
    failed transaction read back; None: unknown, load it again."""

    ok: bool
    snapshot: Snapshot | None
    written_bytes: int = 0  # what a successful transaction wrote (values of its puts)


class LedgerStore(Protocol):
    async def load(self, job: str) -> Snapshot:
        """The stored ledger, or a new one from the job's spec; Rejected if unknown."""

    async def commit(
        self, job: str, base: Snapshot, state: LedgerState | None, writes: Writes
    ) -> Committed:
        """Write `state` (None: keep the stored one) and `writes` only if the ledger is
        still at `base`; with nothing to write, only check that it is."""


@dataclass(frozen=True)
class Revision:
    """CAS token of a stored ledger. (create revision, version) names one value of the
    key, as the mod revision would, but is known after a write without reading the
    (possibly large) value back. create == 0: the key does not exist yet."""

    create: int
    version: int


class EtcdLedgers:
    """The committer's store: one etcd key per job's ledger, JSON."""

    def __init__(self, store: Store, keys: Keys, max_txn_bytes: int = 1_500_000) -> None:
        self.store = store
        self.keys = keys
        self.max_txn_bytes = max_txn_bytes

    async def load(self, job: str) -> Snapshot:
        stored = await self.store.get(self.keys.ledger(job))
        if stored is not None:
            return _snapshot(stored)
        return Snapshot(await self.fresh(job), Revision(0, 0))

    async def fresh(self, job: str) -> LedgerState:
        """The ledger of the job's start, from its spec; Rejected if it is not registered."""
        spec = await self.store.get_model(self.keys.spec(job), JobSpec)
        if spec is None:
            raise Rejected(ErrorCode.UNKNOWN_JOB, f"job {job!r} is not registered")
        return new_ledger(spec[0])

    async def snapshot(self, job: str, step: int) -> LedgerState | None:
        """The ledger snapshot of checkpoint `step`, None if it is not kept."""
        stored = await self.store.get_model(self.keys.ledger_checkpoint(job, step), LedgerState)
        return stored[0] if stored is not None else None

    async def commit(
        self, job: str, base: Snapshot, state: LedgerState | None, writes: Writes
    ) -> Committed:
        key = self.keys.ledger(job)
        revision: Revision = base.token
        puts = writes.puts()
        success: list[Op] = [Put(k, v) for k, v in puts]
        success += [Delete(k) for k in writes.deletes()]
        written = sum(len(v) for _, v in puts)
        if state is not None:
            encoded = encode(state)
            written += len(encoded)
            success.append(Put(key, encoded))
            if revision.create == 0:
                success.append(Get(key))  # the new key's create revision: the next token
        size = written + sum(len(op.key) for op in success) + len(key)  # + the compare
        if size > self.max_txn_bytes:
            raise Rejected(
                ErrorCode.TOO_LARGE,
                f"the ledger of job {job!r} would take a {size:,}-byte etcd transaction, "
                f"over max_txn_bytes ({self.max_txn_bytes:,}): nothing was written. Raise "
                "etcd's --max-request-bytes and the shards service's max_txn_bytes together, "
                "or have the ranks hold fewer shards each (prefetch)",
            )
        result = await self.store.txn(_unchanged(key, revision), success, [Get(key)])
        if not result.succeeded:
            current = result.gets[0] if result.gets else None
            return Committed(False, _snapshot(current) if current is not None else None)
        if state is None:
            return Committed(True, base, written)
        if revision.create == 0:
            created = result.gets[-1]
            if created is None:
                return Committed(True, None, written)
            token = Revision(created.create_revision, 1)
        else:
            token = Revision(revision.create, revision.version + 1)
        return Committed(True, Snapshot(state, token), written)


def _unchanged(key: str, revision: Revision) -> list[Compare]:
    if revision.create == 0:
        return [Compare.absent(key)]
    return [Compare(key, "create", revision.create), Compare(key, "version", revision.version)]


def _snapshot(stored: Versioned) -> Snapshot:
    state = decode_stored(stored.key, stored.value, LedgerState)
    return Snapshot(state, Revision(stored.create_revision, stored.version))
