"""An asyncio loop in a daemon thread: where the agent does all its network I/O."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from antdt.runtime.loops import LoopKind, new_event_loop

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str, kind: LoopKind = "asyncio") -> None:
        self.name = name
        self.loop = new_event_loop(kind)
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            # Cancel what is left so that closing the loop does not warn about pending tasks.
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()

    def start(self) -> LoopThread:
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result from another thread."""
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"{self.name}: no result within {timeout}s") from None

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule fn on the loop; a no-op once the loop is gone (late calls at exit)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(fn, *args)

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            self.call_soon(self.loop.stop)
            self._thread.join(timeout)
        elif not self.loop.is_closed() and not self._thread.ident:
            self.loop.close()  # never started
