"""eager.start: a coroutine runs at once up to its first wait, and as a task after it."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable

import pytest

from antdt.runtime.bus import eager

pytestmark = pytest.mark.skipif(not eager.SUPPORTED, reason="Python 3.11+ only")

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="outside")


async def turns_until(condition: Callable[[], bool], turns: int = 20) -> None:
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not true after {turns} loop turns")


async def test_a_coroutine_that_never_waits_completes_without_a_task() -> None:
    seen: list[str] = []

    async def handler() -> None:
        seen.append("handled")

    tasks_before = len(asyncio.all_tasks())
    assert eager.start(handler()) is None
    assert seen == ["handled"]  # at once, not on a later loop turn
    assert len(asyncio.all_tasks()) == tasks_before


async def test_a_coroutine_that_waits_goes_on_as_a_task_with_what_it_awaited() -> None:
    steps: list[str] = []
    first: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    second: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def handler() -> None:
        steps.append("before")
        steps.append(f"got {await first}")
        await asyncio.sleep(0)  # a bare yield to the loop passes through too
        try:
            await second
        except KeyError as exc:
            steps.append(f"raised {exc}")

    task = eager.start(handler())
    assert task is not None and steps == ["before"]
    first.set_result(7)
    await turns_until(lambda: len(steps) == 2)
    assert steps == ["before", "got 7"] and not task.done()
    second.set_exception(KeyError("gone"))
    await asyncio.wait_for(task, 1)
    assert steps == ["before", "got 7", "raised 'gone'"]


@pytest.mark.parametrize("started", [True, False], ids=["waiting", "before-its-first-step"])
async def test_cancelling_the_task_cancels_the_coroutine(started: bool) -> None:
    cleaned: list[str] = []
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def handler() -> None:
        try:
            await never
        finally:
            cleaned.append("finally")

    task = eager.start(handler())
    assert task is not None
    if started:  # the task has taken over the wait on `never`
        await turns_until(lambda: bool(never._callbacks))  # type: ignore[attr-defined]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await turns_until(lambda: bool(cleaned))
    assert cleaned == ["finally"]
    assert never.cancelled() == started  # a wait never taken over is only left


async def test_a_variable_set_before_the_wait_is_reset_after_it_in_one_context() -> None:
    # As OpenTelemetry attaches a request's trace context before the handler waits and
    # detaches it after: resetting a token in another context raises ValueError.
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def handler() -> None:
        token = VAR.set("request")
        await gate
        seen.append(VAR.get())
        VAR.reset(token)
        seen.append(VAR.get())

    task = eager.start(handler())
    assert task is not None
    assert VAR.get() == "outside"  # the first step did not leak into the caller's context
    gate.set_result(None)
    await asyncio.wait_for(task, 1)
    assert seen == ["request", "outside"]


async def test_an_error_in_the_first_step_is_raised_to_the_caller() -> None:
    async def handler() -> None:
        raise RuntimeError("at once")

    with pytest.raises(RuntimeError, match="at once"):
        eager.start(handler())
