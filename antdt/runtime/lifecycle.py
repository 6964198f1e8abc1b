"""Service lifecycle: named tasks, one stop signal, a staged and idempotent shutdown, each
step bounded in time: drain (stop taking messages), finish (in-flight work), revoke (give
up leases, so another replica takes over at once), flush (telemetry, logs, connections)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

STAGES = ("drain", "finish", "revoke", "flush")
log = structlog.get_logger("antdt.lifecycle")


class ServiceFailed(RuntimeError):
    """The service stopped because one of its tasks failed (not on request): its
    process must exit non-zero, so that a supervisor restarts it."""


class ServiceRuntime:
    def __init__(self, name: str, *, stage_timeout_s: float = 5.0) -> None:
        self.name = name
        self.stop_event = asyncio.Event()
        self.stage_timeout_s = stage_timeout_s
        # A set, not a dict by name: services sharing a runtime (tests, `antdt up`) may
        # each spawn a task of the same name, and every one must be stopped. A task
        # leaves it when it ends: short ones (a job's commit run, an announcement) are
        # spawned for as long as the service runs.
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stages: dict[str, list[Callable[[], Awaitable[None]]]] = {s: [] for s in STAGES}
        self._shutdown_done = False
        #: the task whose failure stopped the service, and why (None: stopped on request)
        self.failure: str | None = None

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=f"{self.name}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def running(self) -> int:
        """Spawned tasks not ended yet."""
        return len(self._tasks)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or self.stop_event.is_set():
            return
        exc = task.exception()
        if exc is not None:
            log.error("service task failed; stopping", task=task.get_name(), error=repr(exc))
            self.failure = f"{task.get_name()}: {exc!r}"
            self.stop_event.set()

    def on_shutdown(self, stage: str, step: Callable[[], Awaitable[None]]) -> None:
        if stage not in self._stages:
            raise ValueError(f"unknown shutdown stage {stage!r}; one of {STAGES}")
        self._stages[stage].append(step)

    def request_stop(self) -> None:
        self.stop_event.set()

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)

    async def run(self) -> None:
        """Wait for the stop signal, then shut down in stages."""
        self.install_signal_handlers()
        await self.stop_event.wait()
        await self.shutdown()

    async def shutdown(self) -> None:
        if self._shutdown_done:
            return
        self._shutdown_done = True
        self.stop_event.set()
        log.info("shutting down", service=self.name)
        for stage in ("drain", "finish"):
            await self._run_stage(stage)
        tasks = list(self._tasks)  # each leaves the set as it ends
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, self.stage_timeout_s)
        for stage in ("revoke", "flush"):
            await self._run_stage(stage)
        log.info("stopped", service=self.name)

    async def _run_stage(self, stage: str) -> None:
        for step in self._stages[stage]:
            try:
                await asyncio.wait_for(step(), self.stage_timeout_s)
            except Exception as exc:
                log.warning("shutdown step failed", service=self.name, stage=stage, error=repr(exc))
