"""Start a coroutine eagerly: run it at once up to its first wait, and make a task only for
the rest (what Python 3.12's `asyncio.eager_task_factory` does), in the same context, so
that a context variable set before the first wait is seen throughout. Before Python 3.11
(no task context) every coroutine gets a task at once."""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Coroutine, Generator
from typing import Any

#: Whether a task can be given the context of the eager first step (Python 3.11+).
SUPPORTED = sys.version_info >= (3, 11)


def start(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run `coro` up to its first wait; return the task that goes on with it, or None if
    it completed. An exception it raises in that first step is raised here."""
    loop = asyncio.get_running_loop()
    if not SUPPORTED:
        return loop.create_task(coro)
    context = contextvars.copy_context()
    try:
        waiting_on = context.run(coro.send, None)
    except StopIteration:
        return None
    task = loop.create_task(_go_on(coro, waiting_on), context=context)  # type: ignore[call-arg]
    # A task cancelled before its first step never drives `coro` on: close it then, so
    # that its `finally` blocks run, in its context (a no-op once it has finished).
    task.add_done_callback(lambda _: coro.close(), context=context)
    return task


async def _go_on(coro: Coroutine[Any, Any, None], waiting_on: Any) -> None:
    await _Resumed(coro, waiting_on)


class _Resumed:
    """Awaitable: drives `coro` on from the value it yielded in its first step, passing
    every yield to the task that awaits this and every value or exception back."""

    def __init__(self, coro: Coroutine[Any, Any, None], waiting_on: Any) -> None:
        self._coro = coro
        self._waiting_on = waiting_on

    def __await__(self) -> Generator[Any, Any, None]:
        coro, yielded = self._coro, self._waiting_on
        while True:
            try:
                sent = yield yielded
            except BaseException as exc:  # a cancel, or a future's exception: pass it in
                try:
                    yielded = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration:
                    return
