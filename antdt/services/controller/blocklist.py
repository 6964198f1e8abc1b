"""The host blocklist as one replica sees it: every `blocklist/{host}` entry, followed
with a watch and read against the time. Expired keys are deleted only at the revision
seen expiring (an entry renewed meanwhile stays); a value that is not a BlocklistEntry
blocks its host until deleted."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import structlog

from antdt.runtime.store import Compare, Delete, Store, StoredValueInvalid, decode_stored
from antdt.schemas import BlocklistEntry, Keys

log = structlog.get_logger("antdt.controller.blocklist")
#: Seconds between two sweeps of expired entries, and between retries of a first read.
SWEEP_INTERVAL_S = 60.0
RETRY_S = 1.0


@dataclass(frozen=True)
class Blocked:
    until: float | None  # None: until deleted
    revision: int  # the key's mod revision this was read at


class Blocklist:
    def __init__(self) -> None:
        self.entries: dict[str, Blocked] = {}

    def hosts(self, now: float) -> frozenset[str]:
        """The hosts no rank may be moved to at `now`."""
        return frozenset(
            host for host, b in self.entries.items() if b.until is None or now < b.until
        )

    def expired(self, now: float) -> list[tuple[str, int]]:
        """(host, revision) of every entry that has ended by `now`."""
        return [
            (h, b.revision)
            for h, b in self.entries.items()
            if b.until is not None and now >= b.until
        ]

    def apply(self, host: str, value: bytes | None, revision: int) -> None:
        """A put (value) or delete (None) of `blocklist/{host}`."""
        if value is None:
            self.entries.pop(host, None)
            return
        try:
            until = decode_stored(host, value, BlocklistEntry).until
        except StoredValueInvalid as exc:
            log.warning(
                "blocklist entry unreadable: host blocked until deleted",
                host=host,
                error=exc.reason,
            )
            until = None
        self.entries[host] = Blocked(until, revision)

    async def follow(self, store: Store, keys: Keys) -> None:
        """Run as a task: keep `entries` equal to what is under `blocklist/`."""
        async for event in store.follow_prefix(keys.blocklists(), retry_s=RETRY_S):
            if host := keys.host_of_blocklist_key(event.key):
                self.apply(host, event.value if event.kind == "put" else None, event.mod_revision)

    async def sweep_expired(
        self, store: Store, keys: Keys, *, interval_s: float = SWEEP_INTERVAL_S
    ) -> None:
        """Run as a task: delete expired entries from etcd (the watch then drops them)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.sweep(store, keys, time.time())
            except Exception as exc:  # etcd away: the next sweep
                log.info("blocklist sweep failed", error=repr(exc))

    async def sweep(self, store: Store, keys: Keys, now: float) -> list[str]:
        """Delete the entries expired at `now`, each only at the revision seen expiring;
        returns the hosts deleted."""
        deleted = []
        for host, revision in self.expired(now):
            key = keys.blocklist(host)
            result = await store.txn([Compare.mod_is(key, revision)], [Delete(key)])
            if result.succeeded:
                deleted.append(host)
                log.info("blocklist entry expired", host=host)
        return deleted
