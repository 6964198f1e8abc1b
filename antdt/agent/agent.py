"""The agent: the training-thread API (epochs, steps, checkpoints, restarts) in front of
a Session, whose loop thread does the network I/O."""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator
from enum import Enum
from typing import Any, NoReturn

import structlog
from opentelemetry.sdk.trace import TracerProvider

from antdt.agent import incarnation, restart
from antdt.agent.collectives import Collectives, TorchCollectives
from antdt.agent.commands import CommandHandler
from antdt.agent.errors import AgentClosed, RestartMismatch
from antdt.agent.inject import InjectionSchedule
from antdt.agent.outbox import RestoreMark
from antdt.agent.session import Parts, Session, open_session
from antdt.agent.settings import AgentSettings
from antdt.agent.steps import Step
from antdt.agent.timeline import StepPlans
from antdt.runtime.telemetry import flush_tracing
from antdt.runtime.telemetry.tracing_agent import AgentTraces
from antdt.schemas import (
    CommitReply,
    ExitReason,
    JobSpec,
    Plan,
    ReleaseReply,
    RestoreReply,
    ShardRestore,
    Subjects,
)

log = structlog.get_logger("antdt.agent")


class Phase(Enum):
    """An agent's life: NEW --start()--> RUNNING --close()--> CLOSED, and NEW --close(), or
    a start() that failed--> CLOSED. Its session lives on after close, for its counters."""

    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"


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
        s = self.settings = settings
        self.subjects = Subjects(s.nats.subject_prefix)
        self._tracer_provider = tracer_provider
        self._collectives = collectives
        plans = StepPlans(s.job, s.world_size)
        traces = AgentTraces(s.job, s.rank, tracer_provider)
        self._parts = Parts(
            plans=plans,
            commands=CommandHandler(
                s.job, s.rank, s.world_size, plans, traces, restarts_left=s.restarts_left
            ),
            traces=traces,
            schedule=InjectionSchedule.parse(s.inject).for_rank(s.rank, s.host),
            collectives=self._get_collectives,
        )
        self._phase = Phase.NEW
        self._session: Session | None = None  # set by a start() that succeeded, whole
        self._restored = False
        self._feed: Any = None  # the DataLoader's BatchFeed, made by batch_sampler()
        self._group_restarts: int | None = None  # agreed by the ranks (restarted())
        #: Restores whose ledger incarnation was behind the launcher's restart count.
        self.incarnation_corrections = 0

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Agent:
        """Connect, say hello, register the job (retrying up to register_timeout_s).
        Blocks until registered; raises AgentError otherwise."""
        if self._phase is not Phase.NEW:
            return self
        try:
            self._session = open_session(self.settings, self._parts)
        except BaseException:
            self._phase = Phase.CLOSED
            flush_tracing(self._tracer_provider, 2.0)
            raise
        self._phase = Phase.RUNNING
        atexit.register(self.close)
        s = self.settings
        log.info(
            "agent started",
            job=s.job,
            rank=s.rank,
            local_rank=s.local_rank,
            host=s.host,
            restart_count=s.restart_count,
            plan=self.plan.version,
        )
        return self

    def close(self) -> None:
        """Flush step events and done reports (bounded by close_timeout_s), say the rank
        exits (finished once the shards service said the job is done), drain the bus and
        stop the loop. Idempotent."""
        self._close(ExitReason.CLOSED)

    def _close(self, reason: ExitReason) -> None:
        phase, self._phase = self._phase, Phase.CLOSED
        if phase is not Phase.RUNNING or self._session is None:
            return
        atexit.unregister(self.close)
        session = self._session
        if reason is ExitReason.CLOSED and session.stream.job_done:
            reason = ExitReason.FINISHED  # its silence is then no stall
        session.close(reason, max(self.step - 1, 0), self.settings.close_timeout_s)
        flush_tracing(self._tracer_provider, 2.0)
        if self.dropped_events:
            log.info("step events dropped", count=self.dropped_events)

    def __enter__(self) -> Agent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _live(self) -> Session:
        if self._phase is Phase.CLOSED:
            raise AgentClosed("the agent is closed")
        if self._session is None:
            raise RuntimeError("the agent is not running: call start() (or antdt.agent.init())")
        return self._session

    # -- training-thread API -------------------------------------------------------

    def epochs(self) -> Iterator[int]:
        """Epoch numbers, until the shards service reports the job done. A restarted
        group must restore() first (RestartMismatch otherwise: nothing is fetched)."""
        session = self._live()
        problem = incarnation.before_training(self.settings.restart_count, self._restored)
        if problem is not None and not session.stream.started:
            raise RestartMismatch(problem)
        session.start_fetching()
        return session.driver.epochs()

    def steps(self) -> Iterator[Step]:
        """The steps of the current epoch, until no rank has data left in it."""
        return self._live().driver.steps()

    def batch_sampler(self, dataset: Any = None, max_local_batch: int | None = None) -> Any:
        """A batch sampler for `DataLoader(dataset, batch_sampler=...)`, fed by the ledger
        and sized by the plan; iterate the loader through `batches()`. `dataset` is
        checked against the job's size (DatasetTooSmall); a plan over `max_local_batch`
        (default: the settings') raises PlanUnfillable."""
        from antdt.agent.loader import LedgerBatchSampler, check_dataset

        feed = self._batch_feed()
        if dataset is not None:
            check_dataset(dataset, feed.dataset_size)
        if max_local_batch is not None:
            feed.cap = max_local_batch
        return LedgerBatchSampler(feed)

    def batches(self, loader: Any, empty: Any = None) -> Iterator[tuple[Step, Any]]:
        """The current epoch's steps with their batches from `loader` (built with
        batch_sampler()); `empty` stands in for the batch on a step where this rank has no
        samples (an epoch's tail, a plan giving it 0). Data wait is the time blocked on
        the loader; call step.sync() every step."""
        return self._batch_feed().batches(loader, empty)

    def _batch_feed(self) -> Any:
        from antdt.agent.loader import BatchFeed

        session = self._live()
        if self._feed is None:
            size = session.spec.dataset_size if session.spec else self.settings.dataset_size
            cap = self.settings.max_local_batch
            self._feed = BatchFeed(session.driver, self.settings.rank, size, cap, self._live)
        return self._feed

    def weighted(self, model: Any, process_group: Any = None) -> Any:
        """Make a DDP model's all-reduce, or an FSDP2 (`fully_shard`) model's reduce-scatter,
        give every step the mean gradient over all its samples; returns `model`. Once,
        before training; `step.sync(model)` then only times (every rank must still run
        backward every step). `process_group`: DDP's, if not the default."""
        from antdt.agent import gradients

        driver = self._live().driver
        state = gradients.WeightedHookState(process_group=process_group)
        gradients.weighted(model, state)
        driver.hook_state, driver.ddp_model = state, model
        return model

    def register_ddp(self, ddp_model: Any, process_group: Any = None) -> None:
        """The former name of `weighted` for a DDP model."""
        self.weighted(ddp_model, process_group)

    # -- checkpoints, restarts, removal ------------------------------------------------

    def restore(self, step: int | None, token: str | None = None) -> RestoreReply:
        """Put the job's data ledger back to checkpoint `step` (that of the model this
        process loaded; None: start over). On every rank of a restarted job, after the
        process group is up and before `epochs()`; the ranks agree on a token through the
        process group unless `token` (or ANTDT_RESTORE_TOKEN) names one. Resumes at step + 1."""
        session = self._live()
        if session.stream.started:
            raise RuntimeError("restore() must come before the first epochs()")
        s = self.settings
        token = token or s.restore_token or self._agree_token()
        req = ShardRestore(job=s.job, rank=s.rank, token=token, step=step)
        timeout = s.ledger_timeout_s
        reply = session.run(session.ledger.restore(req, timeout), timeout=timeout + 5)
        session.stream.set_incarnation(reply.incarnation)
        self._restored = True
        count = self._group_restarts if self._group_restarts is not None else s.restart_count
        correction = incarnation.after_restore(count, reply.incarnation)
        if correction is not None:
            self.incarnation_corrections += 1
            log.warning("restart count corrected", job=s.job, reason=correction)
        if s.sample_log:
            session.publisher.log_ids(RestoreMark(step))
        self._parts.plans.rewind(0 if step is None else step + 1)
        log.info(
            "ledger restored",
            job=s.job,
            step=step,
            epoch=reply.epoch,
            incarnation=reply.incarnation,
            restored_here=reply.restored,
        )
        session.start_fetching()
        return reply

    def restarted(self) -> bool:
        """Whether any rank's launcher restarted its group (collective: on every rank).
        torchrun counts restarts per node: a node restarted only because another failed
        keeps its count, so a script decides to restore() on this, not on its own count."""
        if self._group_restarts is None:
            own = self.settings.restart_count
            self._group_restarts = self._get_collectives().agree_max(own)
        return self._group_restarts > 0

    def _agree_token(self) -> str:
        mine = int.from_bytes(os.urandom(7), "big")
        return f"r{self._get_collectives().agree_max(mine):x}"

    def commit(self, step: int | None = None) -> CommitReply:
        """Commit this rank's data positions for a model checkpoint after `step` (default:
        the last synced step) and wait until every rank has: then save the model. On every
        rank, between steps. A checkpoint whose commit did not complete must not be used."""
        session = self._live()
        last = self.step - 1
        if session.driver.open_step_unsynced():
            raise RuntimeError("commit() goes between steps: after step.sync(), not before")
        if step is None:
            step = last
        if step != last or last < 0:
            raise ValueError(f"commit for step {step}, but the last synced step is {last}")
        timeout = self.settings.ledger_timeout_s
        reply = session.run(session.ledger.commit(step, timeout), timeout=timeout + 5)
        log.info("checkpoint committed", job=self.settings.job, step=step)
        return reply

    def leave(self, reason: str = "leaving") -> ReleaseReply:
        """Remove this rank from the job without a rollback: what it trained stays in the
        model, the rest of its shards go to the other ranks. Then close the agent."""
        session = self._live()
        if session.driver.open_step_unsynced():
            raise RuntimeError("leave() goes between steps: after step.sync()")
        timeout = self.settings.ledger_timeout_s
        reply = session.run(session.ledger.release(reason, timeout), timeout=timeout + 5)
        log.info("rank left the job", job=self.settings.job, returned=reply.returned)
        self.close()
        return reply

    def restart_due(self, step: int) -> bool:
        """True once a KILL_RESTART asked this job to checkpoint at or before `step`
        (the step just synced): checkpoint now, then call exit_for_restart()."""
        return self._parts.commands.restart_due(step)

    def exit_for_restart(self) -> NoReturn:
        """After the checkpoint of a requested restart: tell the launcher which hosts to
        avoid, close the agent and exit with RESTART_EXIT_CODE."""
        request = self._parts.commands.restart
        if request is None:
            raise RuntimeError("no restart was requested")
        restart.write_request(os.environ.get("ANTDT_LAUNCH_DIR"), self.settings.rank, request)
        self._close(ExitReason.RESTART)
        os._exit(restart.RESTART_EXIT_CODE)  # past torch's and atexit's teardown: no hang

    def _get_collectives(self) -> Collectives:
        # Created at the first step, not at start(): the process group may come later.
        if self._collectives is None:
            self._collectives = TorchCollectives(self.settings.world_size)
        return self._collectives

    # -- state ---------------------------------------------------------------------------

    @property
    def restartable(self) -> bool:
        """Set by a script that checkpoints when restart_due() says so: only then is a
        KILL_RESTART accepted (else the job would lose everything since its start)."""
        return self._parts.commands.restartable

    @restartable.setter
    def restartable(self, value: bool) -> None:
        self._parts.commands.restartable = value

    @property
    def commands(self) -> int:
        """Commands received (every one, accepted or not)."""
        return self._parts.commands.received

    @property
    def spec(self) -> JobSpec | None:
        """The job's stored spec (None before start)."""
        return self._session.spec if self._session else None

    @property
    def plan(self) -> Plan:
        """The plan the next step will run under (unless a newer one arrives first)."""
        return self._parts.plans.plan

    @property
    def step(self) -> int:
        """The global index of the next step."""
        return self._parts.plans.step

    @property
    def epoch(self) -> int | None:
        """The epoch being trained (None before the first)."""
        return self._session.driver.epoch if self._session else None

    @property
    def dropped_events(self) -> int:
        return self._session.publisher.events.dropped if self._session else 0

    @property
    def loader_recuts(self) -> int:
        """DataLoader iterations restarted because a new plan changed a step read ahead."""
        return self._feed.recuts if self._feed is not None else 0

    @property
    def fetch_errors(self) -> int:
        return sum(self._session.stream.errors.values()) if self._session else 0
