"""`Store`: etcd with str keys and bytes values. Callers never see aetcd's types or
exceptions: every call raises StoreError (StoreUnavailable: etcd unreachable or too slow,
worth retrying). Multi-key changes are one transaction (`txn`); fenced writes compare."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

import aetcd
import aetcd.exceptions
import structlog
from pydantic import BaseModel

from antdt.runtime.backoff import Backoff
from antdt.runtime.config import EtcdSettings
from antdt.runtime.store.client import EtcdClient, etcd_refusal
from antdt.runtime.store.decoding import decode_stored
from antdt.runtime.store.lease import Lease
from antdt.runtime.store.values import (
    Compare,
    Get,
    HistoryCompacted,
    Op,
    Put,
    StoreError,
    StoreUnavailable,
    TxnResult,
    Versioned,
    WatchEvent,
)

log = structlog.get_logger("antdt.store")
#: The longest wait between tries to watch again while etcd is away, seconds.
WATCH_RETRY_MAX_S = 5.0
T = TypeVar("T", bound=BaseModel)
P = ParamSpec("P")
R = TypeVar("R")


#: The first pause between tries at etcd, seconds (then doubling, up to backoff_max_s).
RETRY_FIRST_S = 0.2

_UNAVAILABLE = (aetcd.ConnectionFailedError, aetcd.ConnectionTimeoutError, aetcd.InternalError)


def _etcd_call(
    method: Callable[Concatenate[Store, P], Awaitable[R]],
) -> Callable[Concatenate[Store, P], Awaitable[R]]:
    """Translate the client's exceptions into StoreError at the seam; a call refused for
    a token etcd no longer knows is made once more after logging in again."""

    @functools.wraps(method)
    async def call(self: Store, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            try:
                return await method(self, *args, **kwargs)
            except aetcd.exceptions.UnauthenticatedError as exc:
                log.info("etcd login renewed", call=method.__name__, refused=str(exc))
                await self.client.log_in_again()
                return await method(self, *args, **kwargs)
        except aetcd.ClientError as exc:
            kind = StoreUnavailable if isinstance(exc, _UNAVAILABLE) else StoreError
            raise kind(f"etcd {method.__name__}: {type(exc).__name__}: {exc}") from exc

    return call


def _versioned(kv: Any) -> Versioned:
    return Versioned(
        key=kv.key.decode(),
        value=bytes(kv.value),
        mod_revision=int(kv.mod_revision),
        create_revision=int(kv.create_revision),
        version=int(kv.version),
        lease=int(kv.lease),
    )


class Store:
    """An etcd v3 client with typed helpers."""

    def __init__(self, settings: EtcdSettings) -> None:
        self.settings = settings
        self.client = self._new_client()

    def _new_client(self) -> EtcdClient:
        return EtcdClient(self.settings)

    async def connect(self, *, retry_for_s: float | None = 30.0) -> Store:
        """Connect and read one key of the prefix, retrying with backoff for up to
        `retry_for_s` seconds (None: as long as it takes, saying so now and then);
        credentials or certificates etcd refuses fail at once."""
        loop, where = asyncio.get_running_loop(), self.settings.endpoint
        started, attempt = loop.time(), 0
        backoff = Backoff(RETRY_FIRST_S, self.settings.backoff_max_s, retry_for_s)
        while True:
            attempt += 1
            try:
                await self.client.connect()
                await self.client.get(self.key("ping").encode())
            except Exception as exc:
                await self._after_failed_connect(exc)
                if backoff.gives_up(loop.time() - started):
                    raise StoreError(f"cannot reach etcd at {where}: {exc}") from exc
                if retry_for_s is None and backoff.worth_reporting(attempt):
                    log.info("waiting for etcd", endpoint=where, attempt=attempt, error=str(exc))
                await asyncio.sleep(backoff.delay(attempt))
                continue
            if attempt > 1:
                log.info("etcd ready", endpoint=where, waited_s=round(loop.time() - started, 1))
            return self

    async def _after_failed_connect(self, exc: Exception) -> None:
        refusal = etcd_refusal(exc)
        if refusal is not None:
            await self.close()
            self.client = self._new_client()
            raise StoreError(f"etcd at {self.settings.endpoint}: {refusal}") from exc

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.close()

    def key(self, suffix: str) -> str:
        return self.settings.key_prefix + suffix

    # -- reads and writes --------------------------------------------------------------

    @_etcd_call
    async def get(self, key: str) -> Versioned | None:
        got = await self.client.get(key.encode())
        return _versioned(got) if got is not None else None

    @_etcd_call
    async def get_prefix(self, prefix: str, *, keys_only: bool = False) -> list[Versioned]:
        got = await self.client.get_prefix(prefix.encode(), keys_only=keys_only)
        return [_versioned(kv) for kv in got]

    async def get_model(self, key: str, model: type[T]) -> tuple[T, int] | None:
        """The model stored at `key` and its mod revision, or None; StoredValueInvalid
        when the value there is not one."""
        got = await self.get(key)
        if got is None:
            return None
        return decode_stored(key, got.value, model), got.mod_revision

    @_etcd_call
    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> None:
        await self.client.put(key.encode(), value, lease=lease.id if lease else None)

    @_etcd_call
    async def delete(self, key: str) -> bool:
        return bool(await self.client.delete(key.encode()))

    @_etcd_call
    async def delete_prefix(self, prefix: str) -> None:
        await self.client.delete_prefix(prefix.encode())

    @_etcd_call
    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """One etcd transaction. `gets` holds the Get results of the branch that ran."""
        tx = self.client.transactions
        built = [self._compare(tx, c) for c in compares]
        ok, responses = await self.client.transaction(
            compare=built,
            success=[self._op(tx, op) for op in success],
            failure=[self._op(tx, op) for op in failure],
        )
        branch = success if ok else failure
        gets: list[Versioned | None] = []
        get_results = iter(r for r in responses if isinstance(r, list))
        for op in branch:
            if isinstance(op, Get):
                rows = next(get_results, [])
                gets.append(_versioned(rows[0][1]) if rows else None)
        return TxnResult(succeeded=bool(ok), gets=gets)

    async def cas(
        self,
        key: str,
        value: bytes,
        expected_mod_revision: int,
        *,
        fences: Sequence[Compare] = (),
        also: Sequence[Op] = (),
        lease: Lease | None = None,
    ) -> int | None:
        """Put `value` only if `key` is still at `expected_mod_revision` (0: absent) and
        every fence holds (e.g. the caller still owns the job). Returns the key's new mod
        revision, or None when a condition failed (nothing was written)."""
        compares = [Compare.mod_is(key, expected_mod_revision), *fences]
        put = Put(key, value, lease.id if lease else None)
        result = await self.txn(compares, [put, *also, Get(key)])
        if not result.succeeded:
            return None
        written = result.gets[-1]
        return written.mod_revision if written is not None else None

    @staticmethod
    def _compare(tx: Any, c: Compare) -> Any:
        target = {"mod": tx.mod, "create": tx.create, "version": tx.version, "value": tx.value}[
            c.target
        ](c.key.encode())
        value = c.value
        if c.op == "==":
            return target == value
        if c.op == "!=":
            return target != value
        if c.op == "<":
            return target < value
        return target > value

    @staticmethod
    def _op(tx: Any, op: Op) -> Any:
        if isinstance(op, Put):
            return tx.put(op.key.encode(), op.value, lease=op.lease)
        if isinstance(op, Get):
            return tx.get(op.key.encode())
        if op.prefix:
            return tx.delete(
                op.key.encode(), range_end=aetcd.utils.prefix_range_end(op.key.encode())
            )
        return tx.delete(op.key.encode())

    # -- leases and watches --------------------------------------------------------------

    @_etcd_call
    async def grant_lease(self, ttl: int | None = None) -> Lease:
        ttl = ttl or self.settings.lease_ttl_s
        asked_at = asyncio.get_running_loop().time()  # etcd's TTL runs from no earlier
        raw = await self.client.lease(ttl)
        return Lease(self.client, int(raw.id), ttl, granted_after=asked_at)

    @_etcd_call
    async def current_revision(self) -> int:
        status = await self.client.get_prefix(self.key("revision-probe").encode(), keys_only=True)
        return int(status.header.revision)

    async def follow_prefix(
        self, prefix: str, *, retry_s: float = 1.0
    ) -> AsyncIterator[WatchEvent]:
        """What is under `prefix` now, as puts, then every change after it: what a replica
        needs to keep a map equal to etcd's. The first read is retried while etcd is
        away; the watch resumes on its own (watch_prefix). A watch that fell behind
        etcd's compaction (away longer than etcd keeps history) cannot resume where it
        was: the prefix is read again, and what went meanwhile is yielded as deletes."""
        known: set[str] = set()
        while True:
            revision, items = await self._read_prefix(prefix, retry_s)
            present = {item.key for item in items}
            for key in sorted(known - present):
                yield WatchEvent(kind="delete", key=key, value=b"", mod_revision=revision)
            for item in items:
                yield WatchEvent("put", item.key, item.value, item.mod_revision)
            known = present
            try:
                async for event in self.watch_prefix(
                    prefix, start_revision=revision + 1, on_compacted="raise"
                ):
                    if event.kind == "put":
                        known.add(event.key)
                    else:
                        known.discard(event.key)
                    yield event
            except HistoryCompacted:
                log.warning("watch fell behind etcd's compaction; reading again", prefix=prefix)

    async def _read_prefix(self, prefix: str, retry_s: float) -> tuple[int, list[Versioned]]:
        """The revision and the items under `prefix` as of it (retried while etcd is away;
        the revision is read first, so no change after it is missed)."""
        while True:
            try:
                revision = await self.current_revision()
                return revision, await self.get_prefix(prefix)
            except StoreError as exc:
                log.info("prefix not readable yet", prefix=prefix, error=str(exc))
                await asyncio.sleep(retry_s)

    async def watch_prefix(
        self,
        prefix: str,
        *,
        start_revision: int | None = None,
        retry_s: float = 0.3,
        on_compacted: Literal["resume", "raise"] = "resume",
    ) -> AsyncIterator[WatchEvent]:
        """Every change under `prefix`, resuming after etcd restarts from the revision
        after the last one delivered (so nothing is missed and nothing repeats). When
        etcd has compacted that revision away, the changes since are gone: "resume"
        carries on from now (missing them), "raise" raises HistoryCompacted. etcd away,
        the watch is tried again from `retry_s`, doubling up to WATCH_RETRY_MAX_S, and
        said so less often as it waits."""
        next_revision, failures = start_revision, 0
        while True:
            client = self._new_client()  # a watch gets its own channel: restarts stay local
            try:
                await client.connect()
                watch = await client.watch_prefix(prefix.encode(), start_revision=next_revision)
                failures = 0  # etcd answered: the next interruption starts over
                async for event in watch:
                    kv = event.kv
                    next_revision = int(kv.mod_revision) + 1
                    yield WatchEvent(
                        kind="put" if event.kind == aetcd.EventKind.PUT else "delete",
                        key=kv.key.decode(),
                        value=bytes(kv.value),
                        mod_revision=int(kv.mod_revision),
                    )
            except asyncio.CancelledError:
                raise
            except aetcd.RevisionCompactedError as exc:
                if on_compacted == "raise":
                    raise HistoryCompacted(prefix, next_revision) from exc
                log.warning("watch revision compacted; resuming from now", prefix=prefix)
                next_revision = None
            except Exception as exc:
                failures += 1
                if Backoff.worth_reporting(failures):
                    log.info("watch interrupted; resuming", prefix=prefix, error=str(exc))
            finally:
                with contextlib.suppress(Exception):
                    await client.close()
            await asyncio.sleep(
                Backoff(retry_s, max(retry_s, WATCH_RETRY_MAX_S)).delay(failures or 1)
            )

    @_etcd_call
    async def compact(self, revision: int) -> None:
        """Drop etcd's history before `revision` (what etcd's auto-compaction does)."""
        await self.client.compact(revision)


async def retrying(call: Any, *, attempts: int = 50, delay_s: float = 0.1) -> Any:
    """Run `await call()` until it succeeds, for idempotent calls across etcd restarts."""
    for attempt in range(attempts):
        try:
            return await call()
        except StoreUnavailable:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(delay_s)
    return None
