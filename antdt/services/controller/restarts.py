"""KILL_RESTART bookkeeping the executor calls: the guardrails again, the restart ledger
(`begin`, `abandon`), the command, and the restart cost folded from JobHealth. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from antdt.schemas import BlocklistEntry, JobHealth, KillRestart, PendingRestart, RestartLedger
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
    return no_spare(view, action.host)


def no_spare(view: JobView, host: str) -> str:
    """Why the rank cannot leave `host` ('' when it can): nodes are registered (torchrun's
    rendezvous gate) and none of them is a free spare."""
    if not view.nodes or any(spare != host for spare in view.free_spares):
        return ""
    busy = ", ".join(sorted(view.nodes)) or "none"
    return (
        f"no free spare node: every registered live node ({busy}) hosts a rank or is "
        "blocklisted; start torchrun on a spare host to allow the restart"
    )


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


def blocklist_entry(
    action: KillRestartAction, job: str, *, at: float, ttl_s: float
) -> BlocklistEntry:
    """The host the restart moves the rank off, blocked for `ttl_s` (0: until deleted)."""
    return BlocklistEntry(
        host=action.host,
        job=job,
        rank=action.rank,
        action_id=action.action_id,
        reason=action.reason[:512],
        at=at,
        until=at + ttl_s if ttl_s else None,
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


#: Steps past the checkpoint with no new rank process seen: the job did not restart.
NO_RESTART_STEPS = 5


@dataclass(frozen=True)
class Progress:
    """The latest step seen at or before the checkpoint step, and when first seen."""

    step: int
    at: float


def observe(
    ledger: RestartLedger, progress: Progress | None, health: JobHealth, restarted: bool
) -> tuple[RestartLedger, Progress | None, float | None]:
    """Fold one JobHealth into the restart in flight: the ledger (changed once the job
    resumed), the progress so far, and the cost in seconds once measured (the end of
    checkpoint step C to the end of C + 1, minus one step). `restarted`: a rank said
    hello after the restart was decided (a new process)."""
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
