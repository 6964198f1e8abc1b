"""Requests as committer operations: fetch, and checkpoint commit, restore and release,
whose snapshots are written or deleted at their own keys in the ledger's transaction."""

from __future__ import annotations

from antdt.schemas import Keys, ShardCommit, ShardFetch, ShardRelease, ShardRestore
from antdt.services.shards.change import LedgerChange, Operation
from antdt.services.shards.checkpoints import (
    Outcome,
    apply_commit,
    apply_release,
    apply_restore,
)
from antdt.services.shards.ledger import plan_fetch
from antdt.services.shards.state import LedgerState


def encode(state: LedgerState) -> bytes:
    """A ledger as stored in etcd: straight to bytes (model_dump_json would build a str
    only to have it encoded again)."""
    return LedgerState.__pydantic_serializer__.to_json(state)


def to_change(outcome: Outcome, keys: Keys, job: str) -> LedgerChange:
    return LedgerChange(
        state=outcome.state,
        reply=outcome.reply,
        puts=tuple((keys.ledger_checkpoint(job, step), encode(s)) for step, s in outcome.store),
        deletes=tuple(keys.ledger_checkpoint(job, step) for step in outcome.drop),
    )


def commit_op(req: ShardCommit, keys: Keys, keep: int) -> Operation:
    def op(state: LedgerState) -> LedgerChange:
        return to_change(apply_commit(state, req, keep), keys, req.job)

    return op


def restore_op(
    req: ShardRestore, keys: Keys, snapshot: LedgerState | None, fresh: LedgerState | None
) -> Operation:
    def op(state: LedgerState) -> LedgerChange:
        return to_change(apply_restore(state, req, snapshot, fresh), keys, req.job)

    return op


def release_op(req: ShardRelease, keys: Keys) -> Operation:
    def op(state: LedgerState) -> LedgerChange:
        return to_change(apply_release(state, req), keys, req.job)

    return op


def fetch_op(req: ShardFetch, reserve: int = 0) -> Operation:
    """A ShardFetch as a ledger operation."""

    def op(state: LedgerState) -> LedgerChange:
        result = plan_fetch(state, req, reserve)
        return LedgerChange(
            state=result.state, reply=result.reply, early=result.early, reserved=result.reserved
        )

    return op
