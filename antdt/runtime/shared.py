"""One call per key at a time, its answer shared by the callers that come while it runs
(many events of one job asking for the same etcd reads). A call that fails answers the
waiters with `failed` and raises in the first caller only."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class SharedCalls(Generic[V]):
    def __init__(self, failed: V) -> None:
        self.failed = failed
        self._under_way: dict[str, asyncio.Future[V]] = {}

    def under_way(self, key: str) -> asyncio.Future[V] | None:
        """The call for `key` running now, if any (await it for its answer)."""
        return self._under_way.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._under_way

    async def run(self, key: str, call: Callable[[], Awaitable[V]]) -> V:
        """`call()`'s answer, or the answer of the call for `key` already running."""
        running = self._under_way.get(key)
        if running is not None:
            return await asyncio.shield(running)
        running = self._under_way[key] = asyncio.get_running_loop().create_future()
        answer = self.failed
        try:
            answer = await call()
            return answer
        finally:
            del self._under_way[key]
            running.set_result(answer)
