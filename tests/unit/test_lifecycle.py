"""ServiceRuntime: named tasks, one stop signal, a staged shutdown."""

from __future__ import annotations

import asyncio

import pytest
import typer

from antdt.runtime.lifecycle import ServiceFailed, ServiceRuntime


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
    assert runtime.failure == "test:fails: RuntimeError('boom')"


async def test_a_stop_on_request_is_no_failure() -> None:
    runtime = ServiceRuntime("test")
    runtime.spawn("forever", asyncio.Event().wait())
    runtime.request_stop()
    await runtime.shutdown()
    assert runtime.failure is None


def test_a_service_stopped_by_a_failed_task_exits_non_zero() -> None:
    """A supervisor restarts a process that exits non-zero: one whose lease task died
    (say) must not exit 0 as if it were stopped on purpose."""
    from antdt.cli.serve import until_stopped

    async def failed() -> None:
        raise ServiceFailed("monitor:lease: StoreUnavailable('etcd away')")

    async def stopped() -> None:
        return None

    with pytest.raises(typer.Exit) as exited:
        until_stopped(failed(), "asyncio")
    assert exited.value.exit_code == 1
    until_stopped(stopped(), "asyncio")  # stopped on request: returns, exit 0
