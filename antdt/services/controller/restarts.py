"""KILL_RESTART bookkeeping: pure functions the restart executor calls (no I/O, no clock).

- `restart_violation`: the guardrails checked again just before acting;
- `begin`: the restart ledger once a restart is decided (budget used, the one in flight);
- `AckTally`: which ranks accepted a broadcast KillRestart, and why others did not count;
- `observe`: the measured restart cost, folded from the JobHealth stream (see there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from antdt.schemas import (
    Ack,
    ErrorReply,
    JobHealth,
    KillRestart,
    PendingRestart,
    RestartLedger,
)
from antdt.schemas.restarts import MAX_COSTS
from antdt.services.controller.actions import KillRestartAction
from antdt.services.controller.guardrails import Guardrails
from antdt.services.controller.view import JobView


def restart_violation(view: JobView, action: KillRestartAction, rails: Guardrails) -> str:
    """Why this KILL_RESTART must not run now ('' when it may), whichever policy asked."""
    if not 0 <= action.rank < view.spec.world_size:
        return f"rank {action.rank} is not in the job (world size {view.spec.world_size})"
    held = rails.restart_hold_reason(view)
    if held is not None:
        return held
    current = view.hosts.get(action.rank)
    if current is not None and current != action.host:
        return f"rank {action.rank} runs on {current}, not on {action.host}"
    return ""


def begin(
    ledger: RestartLedger,
    action: KillRestartAction,
    *,
    checkpoint_step: int,
    decided_at: float,
    step_s: float,
) -> RestartLedger:
    """The ledger with this restart decided: budget used, restart in flight."""
    pending = PendingRestart(
        action_id=action.action_id,
        rank=action.rank,
        host=action.host,
        checkpoint_step=checkpoint_step,
        decided_at=decided_at,
        step_s=max(0.0, step_s),
        reason=action.reason[:512],
        incident_id=action.incident_id,
        local_batch_after=action.local_batch_after,
    )
    return ledger.model_copy(
        update={
            "count": ledger.count + 1,
            "last_decided_at": decided_at,
            "last_checkpoint_step": checkpoint_step,
            "pending": pending,
        }
    )


def abandon(ledger: RestartLedger) -> RestartLedger:
    """No rank accepted the restart: nothing is in flight (the budget stays used)."""
    return ledger.model_copy(update={"pending": None})


def kill_command(pending: PendingRestart, job: str, avoid: frozenset[str]) -> KillRestart:
    """The broadcast command for a restart in flight (the same on every retry)."""
    return KillRestart(
        action_id=pending.action_id,
        job=job,
        rank=pending.rank,
        checkpoint_step=pending.checkpoint_step,
        avoid_hosts=tuple(sorted(avoid | {pending.host})),
        reason=pending.reason,
        incident_id=pending.incident_id,
    )


@dataclass
class AckTally:
    """Acks to one broadcast KillRestart. A rank counts once it acked ok=True at exactly
    the checkpoint step; ok=False is its refusal (final, with the agent's reason); any
    other reply (another job or action, a rank outside the job, another step, an
    ErrorReply) is not an ack and is kept in `rejected` with the reason."""

    command: KillRestart
    world_size: int
    ok: dict[int, Ack] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)

    def add(self, reply: Ack | ErrorReply) -> None:
        if isinstance(reply, ErrorReply):
            self.rejected.append(f"error reply: {reply.code}: {reply.error}"[:200])
            return
        reason = self._not_an_ack(reply)
        if reason:
            self.rejected.append(reason)
        elif reply.rank in self.ok or reply.rank in self.refused:
            return  # a duplicate (a retry's answer): the first one counts
        elif reply.ok:
            self.ok[reply.rank] = reply
        else:
            self.refused[reply.rank] = reply.error or "refused without a reason"

    def _not_an_ack(self, ack: Ack) -> str:
        cmd = self.command
        if ack.job != cmd.job or ack.action_id != cmd.action_id:
            return f"ack for {ack.job}/{ack.action_id}, expected {cmd.job}/{cmd.action_id}"
        if ack.rank >= self.world_size:
            return f"ack from rank {ack.rank}, outside the job (world size {self.world_size})"
        if ack.ok and ack.applied_step != cmd.checkpoint_step:
            return f"rank {ack.rank} acked step {ack.applied_step}, not {cmd.checkpoint_step}"
        return ""

    @property
    def pending(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.ok and r not in self.refused]

    @property
    def complete(self) -> bool:
        return not self.pending

    def error(self) -> str | None:
        """The reasons ranks did not accept, for the ActionRecord (None: all accepted)."""
        parts = [f"rank {r}: {e}" for r, e in sorted(self.refused.items())]
        parts += [f"no ack from rank {r}" for r in self.pending]
        parts += [f"not an ack: {reason}" for reason in dict.fromkeys(self.rejected)]
        return "; ".join(parts)[:1024] or None


#: Steps past the checkpoint with no new rank process seen: the job did not restart.
NO_RESTART_STEPS = 5


@dataclass(frozen=True)
class Progress:
    """The latest step seen at or before a restart's checkpoint step, and when it was
    first seen: where the job stopped, once it stops advancing."""

    step: int
    at: float


def observe(
    ledger: RestartLedger, progress: Progress | None, health: JobHealth, restarted: bool
) -> tuple[RestartLedger, Progress | None, float | None]:
    """Fold one JobHealth into the restart in flight. Returns the ledger (changed once the
    job resumed), the progress so far, and the restart cost in seconds once measured.

    `restarted`: a rank said hello after the restart was decided (a new process). The job
    stops at the checkpoint step C (the health's step stays at C, or a little before when
    the last step's event was not published) and resumes at C + 1. The cost is the time
    from the end of step C to the end of step C + 1, minus one step: resume and stop
    times are extrapolated with the step time from the health nearest to them."""
    pending = ledger.pending
    if pending is None:
        return ledger, None, None
    checkpoint = pending.checkpoint_step
    if health.step <= checkpoint:
        if progress is None or health.step > progress.step:
            progress = Progress(health.step, health.at)
        return ledger, progress, None
    if not restarted and health.step <= checkpoint + NO_RESTART_STEPS:
        return ledger, progress, None  # the new processes' hellos may still be on the way
    if progress is None or not restarted:
        # Past the checkpoint without a sighting before it (a takeover meanwhile) or
        # without any new rank process: nothing to measure.
        return abandon(ledger), None, None
    step_s = health.step_s if health.step_s > 0 else pending.step_s
    resumed_at = health.at - (health.step - checkpoint - 1) * step_s
    stopped_at = progress.at + (checkpoint - progress.step) * pending.step_s
    cost = max(0.0, resumed_at - stopped_at - step_s)
    costs = (*ledger.costs, cost)[-MAX_COSTS:]
    return ledger.model_copy(update={"pending": None, "costs": costs}), None, cost
