"""An etcd lease kept alive by a task of its own."""

from __future__ import annotations

import asyncio
import contextlib

import aetcd
import aetcd.exceptions
import structlog

from antdt.runtime.store.client import EtcdClient

log = structlog.get_logger("antdt.store")


class Lease:
    """An etcd lease kept alive by a background task; `lost` is set the moment it may
    have lapsed: `ttl` after the last refresh etcd took was sent (etcd counts from when
    it took it, later), whether the refreshes since failed or hang."""

    def __init__(
        self, client: EtcdClient, lease_id: int, ttl: int, *, granted_after: float | None = None
    ) -> None:
        """`granted_after`: the event loop's time before the grant was asked (its TTL runs
        from no earlier); None: now."""
        self.id = lease_id
        self.ttl = ttl
        self._granted_after = granted_after
        self.lost = asyncio.Event()
        self._client = client
        self._task = asyncio.create_task(self._keep_alive(), name=f"lease-{lease_id}")

    async def _keep_alive(self) -> None:
        clock = asyncio.get_running_loop().time
        interval = max(self.ttl / 3.0, 0.2)
        granted = clock() if self._granted_after is None else self._granted_after
        expires = granted + self.ttl  # etcd's expiry is no earlier
        while not self.lost.is_set():
            await asyncio.sleep(max(0.0, min(interval, expires - clock())))
            sent = clock()
            if sent >= expires:
                break
            try:
                reply = await asyncio.wait_for(self._client.refresh_lease(self.id), expires - sent)
                if reply is None or int(reply.TTL) <= 0:
                    break
                expires = sent + self.ttl
            except TimeoutError:
                break  # no answer before it may have lapsed
            except Exception as exc:
                log.debug("lease refresh failed", lease=self.id, error=str(exc))
                if isinstance(exc, aetcd.exceptions.UnauthenticatedError):
                    with contextlib.suppress(Exception):
                        await self._client.log_in_again()
        self.lost.set()
        log.warning("lease lost", lease=self.id)

    async def revoke(self) -> None:
        """Give the lease up now (idempotent): keys bound to it vanish at once."""
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task
        if not self.lost.is_set():
            self.lost.set()
            with contextlib.suppress(Exception):
                await self._client.revoke_lease(self.id)
