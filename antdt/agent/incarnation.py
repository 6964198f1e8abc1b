"""The launcher's restart count against the data ledger's incarnation (pure).

Every group restart must restore the ledger once, so after a restore the ledger's
incarnation is at least the restart count the ranks agree on (earlier launches of the
same job may have restored too: the ledger may be ahead, never behind). Behind means
restarts went by without a restore, or the count skipped: the ledger, which fences
processes, wins, and the correction is logged and counted."""

from __future__ import annotations


def before_training(restart_count: int, restored: bool) -> str | None:
    """Why a process may not take data yet (None: it may). A restarted group's model
    is back at a checkpoint (or new): taking data from where the failed run left it
    would lose what that run trained since."""
    if restart_count > 0 and not restored:
        return (
            f"this group was restarted (restart count {restart_count}) but the data ledger "
            "was not restored: call agent.restore(step of the loaded checkpoint, or None "
            "to start over) on every rank before epochs()"
        )
    return None


def after_restore(restart_count: int, incarnation: int) -> str | None:
    """The correction to log when the ledger is behind the launcher (None: agreed)."""
    if incarnation >= restart_count:
        return None
    return (
        f"the launcher counts {restart_count} restarts but the data ledger only "
        f"{incarnation} restores: restarts went by without agent.restore() or the count "
        f"skipped; the ledger's incarnation {incarnation} wins"
    )
