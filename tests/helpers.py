"""Test helpers: wait for a condition with a deadline instead of sleeping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def wait_for(
    condition: Callable[[], Any | Awaitable[Any]],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> Any:
    """Poll `condition` (sync or async) until it returns a truthy value; return it."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value) or isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def wait_for_sync(
    condition: Callable[[], Any], *, timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or 'condition'}")
        time.sleep(interval)
