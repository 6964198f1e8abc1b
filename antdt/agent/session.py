"""A connected, registered rank: its loop thread and everything that lives on it.

`open_session` connects, says hello, registers and subscribes, and returns a whole
Session or raises having closed what it opened. Fetching starts later
(`start_fetching`): a restarted job takes no data before its ledger is restored."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from antdt.agent.collectives import Collectives
from antdt.agent.commands import CommandHandler
from antdt.agent.errors import AgentError
from antdt.agent.inject import InjectionSchedule
from antdt.agent.ledger import LedgerClient
from antdt.agent.linkprobe import LinkProbe
from antdt.agent.loopthread import LoopThread
from antdt.agent.publisher import Publisher
from antdt.agent.register import register, spec_differences
from antdt.agent.route import ShardRoute
from antdt.agent.settings import AgentSettings
from antdt.agent.shards import ShardStream
from antdt.agent.shared_work import sharing_for
from antdt.agent.steps import StepDriver
from antdt.agent.stream_state import StreamState
from antdt.agent.timeline import StepPlans
from antdt.runtime.bus import Bus, BusError
from antdt.runtime.telemetry.tracing_agent import AgentTraces
from antdt.schemas import (
    COMMAND_ADAPTER,
    CheckpointCompleted,
    EpochFinished,
    ExitReason,
    JobSpec,
    RankExit,
    RankHello,
    ShardsReturned,
    Subjects,
)

log = structlog.get_logger("antdt.agent")
T = TypeVar("T")


@dataclass(frozen=True)
class Session:
    settings: AgentSettings
    thread: LoopThread
    bus: Bus
    spec: JobSpec  # the stored spec, which wins over this rank's
    stream: ShardStream
    ledger: LedgerClient
    publisher: Publisher
    driver: StepDriver  # the training thread's side
    probe: LinkProbe  # the rank's link to nats-server, measured on the loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run `coro` on the loop; the calling thread waits for its result."""
        return self.thread.run(coro, timeout=timeout)

    def start_fetching(self) -> None:
        if not self.stream.started:
            self.run(_start(self.stream), timeout=5)

    def close(self, reason: ExitReason, step: int, timeout: float) -> None:
        """Flush events and done reports (bounded by `timeout`), say RankExit after the
        last step event, drain the bus and stop the loop."""
        with contextlib.suppress(RuntimeError):
            self.driver.finish(time.perf_counter(), abandoned=True)
        try:
            self.run(self._teardown(reason, step, timeout), timeout=timeout + 7)
        except Exception as exc:
            log.warning("agent close incomplete", error=str(exc))
        self.thread.stop()

    async def _teardown(self, reason: ExitReason, step: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        await self.probe.stop()
        await self.publisher.finish()
        await _say_exit(self.bus, self.settings, reason, step)
        if not await self.stream.flush(max(0.0, deadline - time.monotonic())):
            log.warning("done reports not delivered", pending=self.stream.unreported())
        await self.stream.stop()
        await self.publisher.drain()
        self.publisher.close_file()
        await _close_bus(self.bus, max(0.5, deadline - time.monotonic()))


@dataclass(frozen=True)
class Parts:
    """What the agent makes before connecting, and the session wires in."""

    plans: StepPlans
    commands: CommandHandler
    traces: AgentTraces
    schedule: InjectionSchedule  # this rank's share of ANTDT_INJECT
    collectives: Callable[[], Collectives]  # made at the first step


def open_session(settings: AgentSettings, parts: Parts) -> Session:
    """Connect and register (blocking, up to register_timeout_s); raises AgentError."""
    thread = LoopThread(f"antdt-agent-{settings.rank}", settings.event_loop).start()
    connect = _connect(settings, thread, parts)
    try:
        return thread.run(connect, timeout=settings.register_timeout_s + 15)
    except BaseException:
        thread.stop()
        raise


async def _connect(s: AgentSettings, thread: LoopThread, parts: Parts) -> Session:
    plans = parts.plans
    subjects = Subjects(s.nats.subject_prefix)
    deadline = time.monotonic() + s.register_timeout_s
    bus = await _connect_bus(s)
    async with contextlib.AsyncExitStack() as undo:
        undo.push_async_callback(_abandon, bus, s)
        for subject in (subjects.command(s.job, s.rank), subjects.command_all(s.job)):
            await bus.subscribe(subject, COMMAND_ADAPTER, parts.commands.on_command)
        await bus.publish(subjects.hello(s.job, s.rank), _hello(s))
        reply = await register(bus, subjects.register(s.job), s.job_spec(), deadline)
        _check_spec(s, reply.spec)
        plans.adopt(reply.plan)
        stream = _shard_stream(s, reply.spec, plans, bus, thread, subjects)
        ledger = LedgerClient(bus, stream)
        await bus.subscribe(
            subjects.checkpointed(s.job), CheckpointCompleted, ledger.on_checkpointed
        )
        await bus.subscribe(subjects.epoch_finished(s.job), EpochFinished, stream.on_epoch_finished)
        await bus.subscribe(
            subjects.shards_returned(s.job), ShardsReturned, stream.on_shards_returned
        )
        probe = LinkProbe(bus)
        publisher = Publisher(
            s,
            subjects.step(s.job, s.rank),
            thread=thread,
            bus=bus,
            incarnation=lambda: stream.incarnation,
            on_records=parts.traces.stepped,
            link_rtt=lambda: probe.rtt_s,
        )
        driver = StepDriver(
            rank=s.rank,
            host=s.host,
            stream=stream,
            plans=plans,
            collectives=parts.collectives,
            schedule=parts.schedule,
            emit=publisher.emit,
            log_ids=publisher.log_ids if s.sample_log else None,
            sharing=sharing_for(reply.spec, s.rank),
            max_local_batch=s.max_local_batch,
            restarts=parts.commands,
        )
        undo.pop_all()
    probe.start()
    return Session(s, thread, bus, reply.spec, stream, ledger, publisher, driver, probe)


async def _connect_bus(s: AgentSettings) -> Bus:
    bus = Bus(s.nats, name=f"antdt-agent-{s.job}-{s.rank}")
    try:
        # wait_for: with reconnects enabled nats-py may retry a first connect forever.
        return await asyncio.wait_for(
            bus.connect(retry_for_s=s.register_timeout_s), s.register_timeout_s
        )
    except (BusError, TimeoutError) as exc:
        raise AgentError(f"cannot connect to NATS at {s.nats.url}: {exc or 'timed out'}") from None


def _check_spec(s: AgentSettings, spec: JobSpec) -> None:
    if spec.world_size != s.world_size:
        raise AgentError(
            f"job {s.job} is registered with {spec.world_size} ranks, "
            f"this process runs in a world of {s.world_size}"
        )
    differences = spec_differences(s.job_spec(), spec)
    if differences:
        log.warning("using the stored job spec", job=s.job, differs=differences)


def _shard_stream(
    s: AgentSettings,
    spec: JobSpec,
    plans: StepPlans,
    bus: Bus,
    thread: LoopThread,
    subjects: Subjects,
) -> ShardStream:
    state = StreamState(
        job=s.job,
        rank=s.rank,
        seed=spec.seed,
        prefetch=s.prefetch,
        shard_size=spec.shard_size,
        global_batch=spec.global_batch,
        batch_hint=plans.plan.local_batch[s.rank],  # the first fetch comes before a take
    )
    route = ShardRoute(subjects, s.job)
    return ShardStream(state, bus=bus, route=route, loop=thread.loop)


def _hello(s: AgentSettings) -> RankHello:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return RankHello(
        job=s.job,
        rank=s.rank,
        world_size=s.world_size,
        host=s.host,
        pid=os.getpid(),
        device=s.device,
        cpu_count=max(cpus, 1),
        max_local_batch=s.max_local_batch,
        started_at=time.time(),
    )


async def _start(stream: ShardStream) -> None:
    stream.start()


async def _abandon(bus: Bus, s: AgentSettings) -> None:
    """A start that failed after connecting: say the rank exits, close the connection."""
    await _say_exit(bus, s, ExitReason.CLOSED, 0)
    await _close_bus(bus, 1.0)


async def _say_exit(bus: Bus, s: AgentSettings, reason: ExitReason, step: int) -> None:
    """RankExit, after the last step event (same connection, so in order on NATS)."""
    exit = RankExit(
        job=s.job,
        rank=s.rank,
        host=s.host,
        pid=os.getpid(),
        reason=reason,
        step=step,
        at=time.time(),
    )
    with contextlib.suppress(Exception):  # NATS away: the monitor sees a stall instead
        await bus.publish(Subjects(s.nats.subject_prefix).exit(s.job, s.rank), exit)


async def _close_bus(bus: Bus, timeout: float) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(bus.drain(), timeout)
    await bus.close()
