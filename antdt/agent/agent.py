"""The agent: a background asyncio loop (bus, commands, shard fetching, event publishing)
and the training-thread API (epochs, steps, sync) in front of it."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any, NoReturn

import structlog
from opentelemetry.sdk.trace import TracerProvider

from antdt.agent import restart
from antdt.agent.collectives import Collectives, TorchCollectives
from antdt.agent.errors import AgentClosed, AgentError
from antdt.agent.inject import InjectionSchedule
from antdt.agent.ledger import LedgerClient
from antdt.agent.loopthread import LoopThread
from antdt.agent.outbox import RestoreMark
from antdt.agent.plans import PlanBook, Verdict, applied_step, select_plan
from antdt.agent.publisher import Publisher
from antdt.agent.register import register, spec_differences
from antdt.agent.route import ShardRoute
from antdt.agent.settings import AgentSettings
from antdt.agent.shards import ShardStream
from antdt.agent.steps import Step, StepDriver
from antdt.agent.stream_state import StreamState
from antdt.runtime.bus import Bus, BusError, Delivery, Rejected
from antdt.runtime.telemetry import flush_tracing
from antdt.runtime.telemetry.tracing_agent import AgentTraces
from antdt.schemas import (
    COMMAND_ADAPTER,
    Ack,
    AdjustBatch,
    CheckpointCompleted,
    CommitReply,
    EpochFinished,
    ErrorCode,
    ExitReason,
    JobSpec,
    KillRestart,
    Plan,
    RankExit,
    RankHello,
    ReleaseReply,
    RestoreReply,
    ShardRestore,
    ShardsReturned,
    Subjects,
)

log = structlog.get_logger("antdt.agent")


class Agent:
    """One rank's agent. `start()` connects and registers; then iterate `epochs()` and
    `steps()`; `close()` flushes and stops. The training thread never waits on the
    network except for data and for registration at start."""

    def __init__(
        self,
        settings: AgentSettings,
        *,
        collectives: Collectives | None = None,
        tracer_provider: TracerProvider | None = None,  # flushed by close(); None: global
    ):
        self.settings = settings
        self._tracer_provider = tracer_provider
        self._traces = AgentTraces(settings.job, settings.rank, tracer_provider)
        self.subjects = Subjects(settings.nats.subject_prefix)
        self._schedule = InjectionSchedule.parse(settings.inject).for_rank(
            settings.rank, settings.host
        )
        self._collectives = collectives
        self._plan_lock = threading.Lock()
        self._book = PlanBook()
        self._locked: tuple[int, Plan] | None = None  # (step, plan) chosen for that step
        self._next_step = 0  # the first step whose plan is not chosen yet
        self._out = Publisher(settings, self.subjects, self._traces.stepped)
        self._thread: LoopThread | None = None
        self._bus: Bus | None = None
        self._stream: ShardStream | None = None
        self._ledger: LedgerClient | None = None
        self._driver: StepDriver | None = None
        self.spec: JobSpec | None = None
        self.commands = 0
        self._restart: restart.RestartRequest | None = None
        #: Set by a script that checkpoints when restart_due() says so: only then is a
        #: KILL_RESTART accepted (else the job would lose everything since its start).
        self.restartable = False
        self._closed = False
        self._exit_reason = ExitReason.CLOSED  # what close() tells the monitor

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Agent:
        """Connect, say hello, register the job (retrying up to register_timeout_s) and
        start fetching shards. Blocks until registered; raises AgentError otherwise."""
        if self._thread is not None:
            return self
        s = self.settings
        self._thread = LoopThread(f"antdt-agent-{s.rank}", s.event_loop).start()
        self._out.thread = self._thread
        try:
            self._thread.run(self._connect(), timeout=s.register_timeout_s + 15)
        except BaseException:
            self._closed = True
            with contextlib.suppress(Exception):
                self._thread.run(self._teardown(1.0), timeout=5)
            self._thread.stop()
            raise
        assert self._stream is not None
        self._driver = StepDriver(
            rank=s.rank, host=s.host, stream=self._stream, plan_for=self._plan_for,
            collectives=self._get_collectives, schedule=self._schedule, emit=self._out.emit,
            log_ids=self._out.log_ids if s.sample_log else None,
        )  # fmt: skip
        atexit.register(self.close)
        log.info("agent started", job=s.job, rank=s.rank, host=s.host, plan=self.plan.version)
        return self

    async def _connect(self) -> None:
        s = self.settings
        deadline = time.monotonic() + s.register_timeout_s
        bus = Bus(s.nats, name=f"antdt-agent-{s.job}-{s.rank}")
        try:
            # wait_for: with reconnects enabled nats-py may retry a first connect forever.
            self._bus = await asyncio.wait_for(
                bus.connect(retry_for_s=s.register_timeout_s), s.register_timeout_s
            )
            self._out.bus = self._bus
        except (BusError, TimeoutError) as exc:
            raise AgentError(
                f"cannot connect to NATS at {s.nats.url}: {exc or 'timed out'}"
            ) from None
        await bus.subscribe(self.subjects.command(s.job, s.rank), COMMAND_ADAPTER, self._on_command)
        await bus.subscribe(self.subjects.command_all(s.job), COMMAND_ADAPTER, self._on_command)
        await bus.publish(self.subjects.hello(s.job, s.rank), self._hello())
        reply = await register(bus, self.subjects.register(s.job), s.job_spec(), deadline)
        self._adopt(reply.spec, reply.plan)
        state = StreamState(
            job=s.job, rank=s.rank, seed=reply.spec.seed, prefetch=s.prefetch,
            shard_size=reply.spec.shard_size, global_batch=reply.spec.global_batch,
            batch_hint=self.plan.local_batch[s.rank],  # the first fetch comes before a take
        )  # fmt: skip
        assert self._thread is not None
        route = ShardRoute(self.subjects, s.job)
        self._stream = ShardStream(state, bus=bus, route=route, loop=self._thread.loop)
        self._ledger = LedgerClient(bus, self._stream)
        await bus.subscribe(
            self.subjects.checkpointed(s.job), CheckpointCompleted, self._ledger.on_checkpointed
        )
        await bus.subscribe(
            self.subjects.epoch_finished(s.job), EpochFinished, self._stream.on_epoch_finished
        )
        await bus.subscribe(
            self.subjects.shards_returned(s.job), ShardsReturned, self._stream.on_shards_returned
        )
        # The fetcher starts with the first epoch, or after a restore: a restarted job
        # must not take data before its ledger is back at the checkpoint.

    def _adopt(self, spec: JobSpec, plan: Plan) -> None:
        s = self.settings
        if spec.world_size != s.world_size:
            raise AgentError(
                f"job {s.job} is registered with {spec.world_size} ranks, "
                f"this process runs in a world of {s.world_size}"
            )
        differences = spec_differences(s.job_spec(), spec)
        if differences:
            log.warning("using the stored job spec", job=s.job, differs=differences)
        self.spec = spec
        with self._plan_lock:
            judgement = self._book.judge(plan, job=s.job, world_size=s.world_size)
            if judgement.verdict is Verdict.BAD:
                raise AgentError(f"registered plan unusable: {judgement.reason}")
            if judgement.verdict is Verdict.ACCEPT:  # else a command brought a newer one
                self._book = self._book.add(plan, plan.effective_step, self._next_step)

    def _hello(self) -> RankHello:
        s = self.settings
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
        return RankHello(
            job=s.job, rank=s.rank, world_size=s.world_size, host=s.host, pid=os.getpid(),
            device=s.device, cpu_count=max(cpus, 1), max_local_batch=s.max_local_batch,
            started_at=time.time(),
        )  # fmt: skip

    def close(self) -> None:
        """Flush step events and done reports (bounded by close_timeout_s), say the rank
        exits (finished when the shards service said the job is done; its silence is then
        no stall), drain the bus and stop the loop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        done = self._stream is not None and self._stream.job_done
        if done and self._exit_reason is ExitReason.CLOSED:
            self._exit_reason = ExitReason.FINISHED
        atexit.unregister(self.close)
        if self._driver is not None:
            with contextlib.suppress(RuntimeError):
                self._driver.finish(time.perf_counter(), abandoned=True)
        if self._thread is None:
            return
        timeout = self.settings.close_timeout_s
        try:
            self._thread.run(self._teardown(timeout), timeout=timeout + 7)
        except Exception as exc:
            log.warning("agent close incomplete", error=str(exc))
        self._thread.stop()
        if self.dropped_events:
            log.info("step events dropped", count=self.dropped_events)

    async def _teardown(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        await self._out.finish()
        await self._say_exit()
        if self._stream is not None:
            if not await self._stream.flush(max(0.0, deadline - time.monotonic())):
                log.warning("done reports not delivered", pending=self._stream.unreported())
            await self._stream.stop()
        await self._out.drain()
        self._out.close_file()
        if self._bus is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._bus.drain(), max(0.5, deadline - time.monotonic()))
            await self._bus.close()
        await asyncio.to_thread(flush_tracing, self._tracer_provider, 2.0)

    async def _say_exit(self) -> None:
        """RankExit, after the last step event (same connection, so in order on NATS)."""
        if self._bus is None:
            return
        s = self.settings
        exit = RankExit(
            job=s.job, rank=s.rank, host=s.host, pid=os.getpid(), reason=self._exit_reason,
            step=max(self.step - 1, 0), at=time.time(),
        )  # fmt: skip
        with contextlib.suppress(Exception):  # NATS away: the monitor sees a stall instead
            await self._bus.publish(self.subjects.exit(s.job, s.rank), exit)

    def __enter__(self) -> Agent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- training-thread API -------------------------------------------------------

    def _require_driver(self) -> StepDriver:
        if self._closed:
            raise AgentClosed("the agent is closed")
        if self._driver is None:
            raise RuntimeError("the agent is not running: call start() (or antdt.agent.init())")
        return self._driver

    def epochs(self) -> Iterator[int]:
        """Epoch numbers, until the shards service reports the job done."""
        driver = self._require_driver()
        self._start_fetching()
        return driver.epochs()

    def _start_fetching(self) -> None:
        assert self._thread is not None and self._stream is not None
        if not self._stream.started:
            self._thread.run(self._start_stream(), timeout=5)

    async def _start_stream(self) -> None:
        assert self._stream is not None
        self._stream.start()

    # -- checkpoints, restarts, removal ------------------------------------------------

    def restore(self, step: int | None, token: str | None = None) -> RestoreReply:
        """Put the job's data ledger back to checkpoint `step` (the step of the model
        checkpoint this process loaded; None: none, start over). Call it on every rank of
        a restarted job, after the process group is up and before `epochs()`; the ranks
        agree on a token for this restart through the process group, unless `token` (or
        ANTDT_RESTORE_TOKEN) names one. Training resumes at step + 1."""
        driver = self._require_driver()
        assert self._thread is not None and self._stream is not None and self._ledger
        if self._stream.started:
            raise RuntimeError("restore() must come before the first epochs()")
        s = self.settings
        token = token or s.restore_token or self._agree_token()
        req = ShardRestore(job=s.job, rank=s.rank, token=token, step=step)
        timeout = s.ledger_timeout_s
        reply = self._thread.run(self._ledger.restore(req, timeout), timeout=timeout + 5)
        self._stream.set_incarnation(reply.incarnation)
        self._out.incarnation = reply.incarnation
        if s.sample_log:
            self._out.log_ids(RestoreMark(reply.incarnation, step))
        first = 0 if step is None else step + 1
        with self._plan_lock:
            self._next_step = driver.step = first
        log.info("ledger restored", job=s.job, step=step, epoch=reply.epoch,
                 incarnation=reply.incarnation, restored_here=reply.restored)  # fmt: skip
        self._start_fetching()
        return reply

    def _agree_token(self) -> str:
        mine = int.from_bytes(os.urandom(7), "big")
        return f"r{self._get_collectives().agree_max(mine):x}"

    def commit(self, step: int | None = None) -> CommitReply:
        """Commit this rank's data positions for a model checkpoint after `step` (default:
        the last synced step) and wait until every rank has: then save the model. Call
        it on every rank, between steps (after `step.sync`). A checkpoint whose commit
        did not complete must not be used: restore from the one before."""
        driver = self._require_driver()
        assert self._thread is not None and self._ledger is not None
        last = driver.step - 1
        if driver.open_step_unsynced():
            raise RuntimeError("commit() goes between steps: after step.sync(), not before")
        if step is None:
            step = last
        if step != last or last < 0:
            raise ValueError(f"commit for step {step}, but the last synced step is {last}")
        timeout = self.settings.ledger_timeout_s
        reply = self._thread.run(self._ledger.commit(step, timeout), timeout=timeout + 5)
        log.info("checkpoint committed", job=self.settings.job, step=step)
        return reply

    def leave(self, reason: str = "leaving") -> ReleaseReply:
        """Remove this rank from the job without a rollback: what it trained stays in the
        model, the rest of its shards go to the other ranks. Then close the agent."""
        driver = self._require_driver()
        assert self._thread is not None and self._ledger is not None
        if driver.open_step_unsynced():
            raise RuntimeError("leave() goes between steps: after step.sync()")
        timeout = self.settings.ledger_timeout_s
        reply = self._thread.run(self._ledger.release(reason, timeout), timeout=timeout + 5)
        log.info("rank left the job", job=self.settings.job, returned=reply.returned)
        self.close()
        return reply

    def steps(self) -> Iterator[Step]:
        """The steps of the current epoch, until no rank has data left in it."""
        return self._require_driver().steps()

    def register_ddp(self, ddp_model: Any, process_group: Any = None) -> None:
        """Keep DDP's overlapped all-reduce, weighted by batch: registers
        `weighted_allreduce_hook` on `ddp_model`; `step.sync(ddp_model)` then only times."""
        from antdt.agent.gradients import WeightedHookState, weighted_allreduce_hook

        driver = self._require_driver()
        state = WeightedHookState(process_group=process_group)
        ddp_model.register_comm_hook(state, weighted_allreduce_hook)
        driver.hook_state, driver.ddp_model = state, ddp_model

    def _get_collectives(self) -> Collectives:
        # Created at the first step, not at start(): the process group may come later.
        if self._collectives is None:
            self._collectives = TorchCollectives(self.settings.world_size)
        return self._collectives

    def _plan_for(self, step: int) -> Plan:
        with self._plan_lock:
            if self._locked is None or self._locked[0] != step:
                self._locked = (step, select_plan(self._book.plans, step))
                self._next_step = step + 1
            return self._locked[1]

    @property
    def plan(self) -> Plan:
        """The plan the next step will run under (unless a newer one arrives first)."""
        with self._plan_lock:
            return select_plan(self._book.plans, self._next_step)

    @property
    def step(self) -> int:
        """The global index of the next step."""
        return self._driver.step if self._driver else 0

    @property
    def epoch(self) -> int | None:
        """The epoch being trained (None before the first)."""
        return self._driver.epoch if self._driver else None

    @property
    def dropped_events(self) -> int:
        return self._out.events.dropped

    @property
    def fetch_errors(self) -> int:
        return sum(self._stream.errors.values()) if self._stream else 0

    # -- commands (on the loop) ---------------------------------------------------------

    async def _on_command(self, cmd: AdjustBatch | KillRestart, delivery: Delivery) -> Ack | None:
        s = self.settings
        self.commands += 1
        if cmd.job != s.job:
            raise Rejected(
                ErrorCode.BAD_REQUEST, f"command for job {cmd.job!r} sent to job {s.job!r}"
            )
        if isinstance(cmd, KillRestart):
            return self._kill_restart(cmd)
        return self._adjust(cmd, delivery.subject)

    def _kill_restart(self, cmd: KillRestart) -> Ack:
        """Every rank checkpoints at the step and exits; the group comes back with
        `cmd.rank` moved off its host. Repeats of the same action are acked again."""
        s = self.settings
        with self._plan_lock:
            next_step = self._next_step
        known = self._restart
        if known is not None and known.action_id == cmd.action_id:
            return self._ack(cmd.action_id, ok=True, applied_step=known.step)
        problem = restart.judge(cmd, next_step, s.world_size)
        if not self.restartable:
            problem = "this job's script does not checkpoint on request (agent.restartable)"
        if problem is not None or known is not None:
            reason = problem or f"a restart at step {known.step} is already pending"  # type: ignore[union-attr]
            return self._ack(cmd.action_id, ok=False, error=reason)
        self._restart = restart.RestartRequest(
            cmd.action_id, cmd.checkpoint_step, cmd.avoid_hosts, cmd.rank
        )
        log.info("restart requested", job=s.job, step=cmd.checkpoint_step,
                 avoid_hosts=list(cmd.avoid_hosts), action_id=cmd.action_id)  # fmt: skip
        return self._ack(cmd.action_id, ok=True, applied_step=cmd.checkpoint_step)

    def restart_due(self, step: int) -> bool:
        """True once a KILL_RESTART asked this job to checkpoint at or before `step`
        (the step just synced): checkpoint now, then call exit_for_restart()."""
        request = self._restart
        return request is not None and step >= request.step

    def exit_for_restart(self) -> NoReturn:
        """After the checkpoint of a requested restart: tell the launcher which hosts to
        avoid, close the agent and exit with RESTART_EXIT_CODE."""
        request = self._restart
        if request is None:
            raise RuntimeError("no restart was requested")
        restart.write_request(os.environ.get("ANTDT_LAUNCH_DIR"), self.settings.rank, request)
        self._exit_reason = ExitReason.RESTART
        self.close()
        os._exit(restart.RESTART_EXIT_CODE)  # past torch's and atexit's teardown: no hang

    def _adjust(self, cmd: AdjustBatch, subject: str) -> Ack:
        s, plan = self.settings, cmd.plan
        with self._plan_lock:
            judgement = self._book.judge(plan, job=s.job, world_size=s.world_size)
            if judgement.verdict is Verdict.STALE:
                raise Rejected(ErrorCode.STALE, judgement.reason)
            if judgement.verdict is Verdict.BAD:
                raise Rejected(ErrorCode.BAD_REQUEST, judgement.reason)
            if judgement.verdict is Verdict.SAME:
                at = self._book.applied_step(plan)
            else:
                at = applied_step(plan, self._next_step)
                self._book = self._book.add(plan, at, self._next_step)
        self._traces.command(cmd, subject, judgement.verdict.value, at)  # loop: spans here
        log.info("plan accepted", version=plan.version, applied_step=at,
                 local_batch=plan.local_batch[s.rank], action_id=cmd.action_id)  # fmt: skip
        return self._ack(cmd.action_id, ok=True, applied_step=at, plan_version=plan.version)

    def _ack(self, action_id: str, *, ok: bool, **fields: Any) -> Ack:
        s = self.settings
        return Ack(action_id=action_id, job=s.job, rank=s.rank, ok=ok, at=time.time(), **fields)
