"""Step events leave the agent in batches (`event_flush_s`): one wake of the agent's loop
per batch, not per step. Real nats-server; the Publisher on its own loop thread, as the
agent runs it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from antdt.agent.loopthread import LoopThread
from antdt.agent.outbox import StepRecord
from antdt.agent.publisher import Publisher
from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.schemas import StepEvent, Subjects
from tests.helpers import wait_for
from tests.integration.agent_fixtures import agent_settings

pytestmark = pytest.mark.integration
T = TypeVar("T")


def _record(step: int) -> StepRecord:
    return StepRecord(
        step=step,
        epoch=0,
        plan_version=0,
        local_batch=8,
        samples=8,
        data_wait_s=0.001,
        comm_s=0.001,
        step_s=0.01,
        started_at=1_800_000_000.0 + step,
    )


class _Rig:
    def __init__(self, settings: ServiceSettings, job: str, **agent: Any) -> None:
        self.cfg = agent_settings(settings.nats, job, 0, 1, **agent)
        self.subject = Subjects(settings.nats.subject_prefix).step(job, 0)
        self.thread = LoopThread("test-publisher").start()
        self.got: list[StepEvent] = []

    async def start(self) -> Publisher:
        self.bus = await self._on_loop(Bus(self.cfg.nats, name="test-agent").connect())
        return Publisher(
            self.cfg,
            self.subject,
            thread=self.thread,
            bus=self.bus,
            incarnation=lambda: 0,
            on_records=lambda _: None,
        )

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(self.thread.submit(coro))

    async def listen(self, bus: Bus) -> None:
        async def keep(event: StepEvent, _headers: object) -> None:
            self.got.append(event)

        await bus.subscribe(self.subject, StepEvent, keep)
        await bus.flush()

    async def stop(self) -> None:
        await self._on_loop(self.bus.close())
        self.thread.stop()


Make = Callable[..., _Rig]


@pytest.fixture
async def rig(settings: ServiceSettings, unique: str) -> AsyncIterator[Make]:
    made: list[_Rig] = []

    def make(**agent: Any) -> _Rig:
        made.append(_Rig(settings, unique, **agent))
        return made[-1]

    yield make
    for r in made:
        await r.stop()


async def test_step_events_wait_for_the_flush_then_go_out_together(rig: Make, bus: Bus) -> None:
    r = rig(dataset_size=64, global_batch=8, event_flush_s=0.4)
    publisher = await r.start()
    await r.listen(bus)
    for step in range(5):
        publisher.emit(_record(step))
    await asyncio.sleep(0.15)
    assert r.got == []  # held back: the flush has not come yet
    await wait_for(lambda: len(r.got) == 5, timeout=5, what="the batch of step events")
    assert [e.step for e in r.got] == [0, 1, 2, 3, 4]


async def test_zero_flush_sends_each_step_event_at_once(rig: Make, bus: Bus) -> None:
    r = rig(dataset_size=64, global_batch=8, event_flush_s=0)
    publisher = await r.start()
    await r.listen(bus)
    publisher.emit(_record(0))
    await wait_for(lambda: len(r.got) == 1, timeout=5, what="the step event")


async def test_a_half_full_queue_flushes_without_waiting(rig: Make, bus: Bus) -> None:
    r = rig(dataset_size=64, global_batch=8, event_flush_s=5, event_queue_max=4)
    publisher = await r.start()
    await r.listen(bus)
    publisher.emit(_record(0))
    publisher.emit(_record(1))  # 2 of 4: half full
    await wait_for(lambda: len(r.got) == 2, timeout=3, what="the early flush")


async def test_close_sends_what_waits_for_the_flush(rig: Make, bus: Bus) -> None:
    r = rig(dataset_size=64, global_batch=8, event_flush_s=5)
    publisher = await r.start()
    await r.listen(bus)
    publisher.emit(_record(0))
    await asyncio.wrap_future(r.thread.submit(publisher.finish()))
    await wait_for(lambda: len(r.got) == 1, timeout=3, what="the event flushed at close")
