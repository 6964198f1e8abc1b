"""ServiceRuntime: named tasks, one stop signal, a staged shutdown."""

from __future__ import annotations

import asyncio

from antdt.runtime.lifecycle import ServiceRuntime


async def test_ended_tasks_are_forgotten_and_running_ones_cancelled_at_shutdown() -> None:
    # Short tasks (a job's commit run, an announcement) are spawned for as long as a
    # service runs: the runtime must not keep every one it ever started.
    runtime = ServiceRuntime("test")
    for i in range(100):
        await runtime.spawn(f"short-{i}", asyncio.sleep(0))
    assert runtime.running() == 0
    forever = runtime.spawn("forever", asyncio.Event().wait())
    steps: list[str] = []

    async def finish() -> None:
        steps.append(f"finish, forever running: {not forever.done()}")

    runtime.on_shutdown("finish", finish)
    await runtime.shutdown()
    assert steps == ["finish, forever running: True"]
    assert forever.cancelled() and runtime.running() == 0


async def test_a_failing_task_stops_the_service() -> None:
    runtime = ServiceRuntime("test")

    async def fail() -> None:
        raise RuntimeError("boom")

    task = runtime.spawn("fails", fail())
    await asyncio.wait([task])
    await asyncio.sleep(0)  # done callbacks run on the next turn
    assert runtime.stop_event.is_set() and runtime.running() == 0
