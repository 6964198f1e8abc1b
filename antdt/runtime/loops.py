"""The event loop a process runs on, by its settings' `event_loop` (ANTDT_EVENT_LOOP): `auto`
(uvloop where importable), `uvloop` (required: a clear error if missing) or `asyncio`.
Services run uvloop where installed (the `services` extra); the agent's I/O thread stays on
asyncio's own loop unless told otherwise: the training process is the user's."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")
LoopKind = Literal["auto", "uvloop", "asyncio"]
LOOP_KIND_HELP = (
    "Event loop: auto (uvloop when installed, else asyncio), uvloop (required), asyncio"
)


def uvloop_available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve(kind: LoopKind) -> Literal["uvloop", "asyncio"]:
    """The loop `kind` means on this machine; `uvloop` without uvloop is an error."""
    if kind == "asyncio":
        return "asyncio"
    if uvloop_available():
        return "uvloop"
    if kind == "uvloop":
        raise RuntimeError(
            "event_loop=uvloop, but uvloop is not installed: pip install uvloop, or set "
            "ANTDT_EVENT_LOOP=auto (or asyncio)"
        )
    return "asyncio"


def loop_factory(kind: LoopKind) -> Callable[[], asyncio.AbstractEventLoop]:
    if resolve(kind) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def new_event_loop(kind: LoopKind) -> asyncio.AbstractEventLoop:
    """A new loop of `kind`, for a thread of its own (the agent's)."""
    return loop_factory(kind)()


def run(main: Coroutine[Any, Any, T], kind: LoopKind) -> T:
    """asyncio.run(main) on a loop of `kind`."""
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
            return runner.run(main)
    loop = new_event_loop(kind)  # pragma: no cover - Python 3.10
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def running_kind() -> Literal["uvloop", "asyncio"]:
    """Which loop the calling coroutine runs on (for logs and bench rows)."""
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
