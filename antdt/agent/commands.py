"""The controller's commands on this rank, handled on the agent's loop.

AdjustBatch: a plan from a step on (`StepPlans.offer`), refused as `stale` or
`bad_request`. KillRestart: every rank checkpoints at the step and exits for the
launcher to restart the group; only a script that checkpoints on request accepts it."""

from __future__ import annotations

import time
from typing import Any

import structlog

from antdt.agent import restart
from antdt.agent.plans import Verdict
from antdt.agent.timeline import StepPlans
from antdt.runtime.bus import Delivery, Rejected
from antdt.runtime.telemetry.tracing_agent import AgentTraces
from antdt.schemas import Ack, AdjustBatch, ErrorCode, KillRestart

log = structlog.get_logger("antdt.agent")


class CommandHandler:
    def __init__(
        self,
        job: str,
        rank: int,
        world_size: int,
        plans: StepPlans,
        traces: AgentTraces,
        *,
        restarts_left: int | None = None,  # the launcher's (None: it did not say)
    ) -> None:
        self._job, self._rank, self._world_size = job, rank, world_size
        self._restarts_left = restarts_left
        self._plans = plans
        self._traces = traces
        self.received = 0
        #: Set by a script that checkpoints when `restart_due` says so (else a restart
        #: would lose everything since the job's start).
        self.restartable = False
        self.restart: restart.RestartRequest | None = None

    async def on_command(self, cmd: AdjustBatch | KillRestart, delivery: Delivery) -> Ack:
        """Bus handler of the rank's and the job's command subjects."""
        self.received += 1
        if cmd.job != self._job:
            raise Rejected(
                ErrorCode.BAD_REQUEST, f"command for job {cmd.job!r} sent to job {self._job!r}"
            )
        if isinstance(cmd, KillRestart):
            return self._kill_restart(cmd)
        return self._adjust(cmd, delivery.subject)

    def restart_due(self, step: int) -> bool:
        """A KILL_RESTART asked this job to checkpoint at or before `step` (and every
        rank took it: `restart_counted`)."""
        request = self.restart
        return request is not None and step >= request.step

    def restart_vote(self, step: int) -> int:
        """1 when this rank took a restart checkpointing at `step` (a step's count)."""
        request = self.restart
        return int(request is not None and request.step == step)

    def restart_counted(self, step: int, votes: int) -> None:
        """`step`'s count found `votes` ranks holding its restart. Unless every rank took
        it, it is dropped: a rank alone would checkpoint and wait at the commit for the
        others, which train on (each took the command, or refused it, on its own: the
        launcher's restarts left are counted per node). The controller has the refusals
        in the acks; no rank moves."""
        request = self.restart
        if request is None or request.step != step or votes >= self._world_size:
            return
        self.restart = None
        log.warning(
            "restart dropped: not every rank took it",
            job=self._job,
            step=step,
            ranks=votes,
            world_size=self._world_size,
            action_id=request.action_id,
        )

    def _adjust(self, cmd: AdjustBatch, subject: str) -> Ack:
        plan = cmd.plan
        judgement, at = self._plans.offer(plan)
        if judgement.verdict is Verdict.STALE:
            raise Rejected(ErrorCode.STALE, judgement.reason)
        if judgement.verdict is Verdict.BAD:
            raise Rejected(ErrorCode.BAD_REQUEST, judgement.reason)
        self._traces.command(cmd, subject, judgement.verdict.value, at)  # loop: spans here
        log.info(
            "plan accepted",
            version=plan.version,
            applied_step=at,
            local_batch=plan.local_batch[self._rank],
            action_id=cmd.action_id,
        )
        return self._ack(cmd.action_id, ok=True, applied_step=at, plan_version=plan.version)

    def _kill_restart(self, cmd: KillRestart) -> Ack:
        """Repeats of the pending action are acked again; any other is refused."""
        known = self.restart
        if known is not None and known.action_id == cmd.action_id:
            return self._ack(cmd.action_id, ok=True, applied_step=known.step)
        problem = restart.judge(cmd, self._plans.first_open, self._world_size)
        if not self.restartable:
            problem = "this job's script does not checkpoint on request (agent.restartable)"
        if self._restarts_left == 0:
            problem = (
                "the launcher has no restart left (torchrun --max-restarts): exiting "
                f"with {restart.RESTART_EXIT_CODE} would end the job"
            )
        if problem is None and known is not None:
            problem = f"a restart at step {known.step} is already pending"
        if problem is not None:
            return self._ack(cmd.action_id, ok=False, error=problem)
        self.restart = restart.RestartRequest(
            cmd.action_id, cmd.checkpoint_step, cmd.avoid_hosts, cmd.rank
        )
        log.info(
            "restart requested",
            job=self._job,
            step=cmd.checkpoint_step,
            avoid_hosts=list(cmd.avoid_hosts),
            action_id=cmd.action_id,
        )
        return self._ack(cmd.action_id, ok=True, applied_step=cmd.checkpoint_step)

    def _ack(self, action_id: str, *, ok: bool, **fields: Any) -> Ack:
        return Ack(
            action_id=action_id, job=self._job, rank=self._rank, ok=ok, at=time.time(), **fields
        )
