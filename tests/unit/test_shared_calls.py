"""SharedCalls: one call per key at a time, its answer shared by those who came meanwhile."""

from __future__ import annotations

import asyncio

import pytest

from antdt.runtime.shared import SharedCalls


async def test_callers_that_come_while_a_call_runs_share_its_answer() -> None:
    shared: SharedCalls[int | None] = SharedCalls(failed=None)
    release = asyncio.Event()
    calls = 0

    async def slow() -> int:
        nonlocal calls
        calls += 1
        await release.wait()
        return 7

    first = asyncio.create_task(shared.run("j", slow))
    await asyncio.sleep(0)
    assert "j" in shared and shared.under_way("j") is not None
    others = [asyncio.create_task(shared.run("j", slow)) for _ in range(3)]
    other_key = asyncio.create_task(shared.run("k", slow))
    await asyncio.sleep(0)
    release.set()
    assert await first == 7 and await asyncio.gather(*others) == [7, 7, 7]
    assert await other_key == 7
    assert calls == 2 and "j" not in shared  # one per key; done, the next call runs again
    assert await shared.run("j", slow) == 7 and calls == 3


async def test_a_failed_call_raises_in_its_caller_and_answers_the_others_failed() -> None:
    shared: SharedCalls[int | None] = SharedCalls(failed=None)
    release = asyncio.Event()

    async def broken() -> int:
        await release.wait()
        raise RuntimeError("etcd away")

    first = asyncio.create_task(shared.run("j", broken))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(shared.run("j", broken))
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(RuntimeError, match="etcd away"):
        await first
    assert await waiter is None and "j" not in shared
