"""Agent ↔ shards service: done-and-fetch in one request, checkpoints, restores, releases."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import Field, model_validator

from antdt.schemas.base import Count, Rank, Token, WireModel, trusted, unset


class ShardRef(WireModel):
    """Names one grant of one shard in one epoch."""

    epoch: Count = Field(description="The epoch the shard was granted in")
    shard: Count = Field(description="Shard index in [0, ceil(dataset_size / shard_size))")
    attempt: Count = Field(description="Grant attempt; bumps when a shard is re-granted")


class ShardGrant(WireModel):
    """A shard handed to a rank: sample ids [start, end), to be consumed from `position`."""

    epoch: Count = Field(description="The epoch the shard is granted in")
    shard: Count = Field(description="Shard index in [0, ceil(dataset_size / shard_size))")
    attempt: Count = Field(description="Grant attempt; bumps when a shard is re-granted")
    start: Count = Field(description="First sample id of the shard")
    end: Count = Field(description="One past the last sample id")
    position: Count = Field(
        default=0, description="Samples of the shard already consumed (resume point)"
    )

    @model_validator(mode="after")
    def _range(self) -> ShardGrant:
        if self.end <= self.start:
            raise ValueError("empty shard range")
        if self.position > self.end - self.start:
            raise ValueError("position past the end of the shard")
        return self

    @property
    def size(self) -> int:
        return self.end - self.start

    def ref(self) -> ShardRef:
        # Its fields are this grant's, valid: built unvalidated (a rank makes one a shard).
        fields = {"epoch": self.epoch, "shard": self.shard, "attempt": self.attempt}
        return trusted(ShardRef, fields)


#: The attempt field fences grants of one incarnation; `incarnation` fences whole restarts.
Incarnation = Annotated[
    int,
    Field(
        ge=0,
        le=1_000_000,
        description="How many times the job was restarted (0: first run); requests from an "
        "older incarnation are refused",
    ),
]


class ShardFetch(WireModel):
    """Report finished shards and ask for up to `want` more, in one request. With `held`
    (every unfinished grant the rank holds) the reply carries only what the rank lacks and
    may go before the done refs are durable, listing them in `unconfirmed` to be sent
    again; without it, the reply re-sends all the rank holds once every change is durable."""

    job: Token = Field(description="Job id; must match the subject's")
    rank: Rank
    epoch: Count = Field(description="The epoch the rank is working on")
    done: tuple[ShardRef, ...] = Field(
        default=(), max_length=64, description="Grants the rank finished since it last said"
    )
    want: int = Field(default=1, ge=0, le=8, description="New grants wanted")
    incarnation: Incarnation = 0
    held: tuple[ShardRef, ...] | None = Field(
        default=None,
        max_length=1024,
        description="Grants the rank holds and has not finished, every one (a step may span "
        "more than a hundred shards); None: not said",
    )
    local_batch: int | None = Field(
        default=None,
        exclude_if=unset,
        ge=0,
        le=10_000_000,
        description="Samples per step the rank takes under its current plan; with "
        "global_batch, its share of the job's consumption, which bounds what the service "
        "reserves for it (a slow rank with a small batch must not hold the epoch's last "
        "shards); None: an even share",
    )
    global_batch: int | None = Field(
        default=None,
        exclude_if=unset,
        ge=1,
        le=10_000_000,
        description="Samples per step of all ranks together",
    )
    settle: bool = Field(
        default=False,
        exclude_if=unset,
        description="Every rank of the rank's group is out of data in `epoch` (a step's "
        "all-reduced sample count was zero): grant and reserve nothing new, and say in the "
        "reply's `outstanding` how many of the epoch's shards are still in flight. The "
        "group ends the epoch once none is in flight and none is left to grant, and takes "
        "up again what was handed back (a removed rank's shards) before leaving it. Shards "
        "in flight for the rank that `held` does not list come back in the reply (OK): a "
        "late request of its own granted them, and the group trains them. Needs want 0",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ShardFetch:
        if self.settle and self.want:
            raise ValueError("a settle request wants nothing (want must be 0)")
        if (self.local_batch is None) != (self.global_batch is None):
            raise ValueError("local_batch and global_batch go together")
        if self.local_batch is not None and self.local_batch > (self.global_batch or 0):
            raise ValueError("local_batch exceeds global_batch")
        return self


class FetchStatus(str, Enum):
    """OK: grants attached (maybe fewer than wanted). EPOCH_DONE: none of the epoch is left
    to grant (some may be in flight). PENDING: the next epoch was asked for while this one
    has shards in flight: retry after retry_after_s. JOB_DONE: every epoch is complete. To
    a settle, OK: the epoch has shards to grant again, or the reply hands back unlisted ones."""

    OK = "ok"
    EPOCH_DONE = "epoch_done"
    PENDING = "pending"
    JOB_DONE = "job_done"


class ShardReply(WireModel):
    """The shards service's answer to a ShardFetch."""

    job: Token = Field(description="Job id")
    epoch: Count = Field(description="The ledger's current epoch")
    status: FetchStatus = Field(description="What the reply says (see FetchStatus)")
    grants: tuple[ShardGrant, ...] = Field(
        default=(), description="New grants, and those re-sent (see ShardFetch.held)"
    )
    retry_after_s: float = Field(
        default=0.0, ge=0, le=60, description="PENDING: ask again after this, seconds"
    )
    unconfirmed: tuple[ShardRef, ...] = Field(
        default=(),
        max_length=64,
        description="Done refs of the request accepted but not yet durable: report them "
        "again (a repeated done is a no-op) until a reply no longer lists them",
    )
    route: str = Field(
        default="",
        max_length=128,
        pattern=r"^[A-Za-z0-9_\-]*$",
        description="The route token of the replica that owns the job's ledger: send the "
        "next fetches to `{p}.{job}.shards.fetch.{route}`, and back to the queue group "
        "when that fails. Empty: use the queue group. Only performance depends on it "
        "(any replica serves any request, compare-and-swap keeps grants apart)",
    )
    outstanding: int | None = Field(
        default=None,
        exclude_if=unset,
        ge=0,
        description="Answering a settle request: shards of the epoch granted and not yet "
        "reported done, by any rank (a removed rank's, until they are handed back; the "
        "asking rank's own, until it reports them). None: not a settle reply",
    )


#: In-flight shards a ShardStatus lists at most (70 bytes each as JSON, at most): a job of
#: 10^4 ranks holding two shards each made a 1.4 MB reply, past nats-server's 1 MB limit.
STATUS_LISTED_MAX = 3000


class ShardStatusRequest(WireModel):
    """Asks for the progress of a job's ledger (`antdt shards status`)."""

    job: Token = Field(description="Job id; must match the subject's")
    ranks: tuple[Rank, ...] = Field(
        default=(), max_length=1024, description="Only these ranks' in-flight shards (empty: any)"
    )
    limit: int = Field(
        default=2000,
        ge=0,
        le=STATUS_LISTED_MAX,
        description="In-flight shards listed at most (lowest ranks first); "
        "`in_flight_total` counts them all",
    )


class InFlight(WireModel):
    """One shard granted and not yet done."""

    rank: Rank
    shard: Count = Field(description="Shard index")
    attempt: Count = Field(description="Grant attempt")
    position: Count = Field(description="Samples of it committed so far (the resume point)")


class ShardStatus(WireModel):
    """Progress of the job's current epoch (for `antdt shards status`)."""

    job: Token = Field(description="Job id")
    epoch: Count = Field(description="The ledger's current epoch")
    epochs: Count = Field(default=1, description="Epochs the job runs")
    num_shards: Count = Field(description="Shards per epoch")
    done: Count = Field(description="Shards of the epoch done")
    todo: Count = Field(description="Shards of the epoch not granted yet")
    in_flight: tuple[InFlight, ...] = Field(
        description="In-flight shards of the ranks asked for, at most the request's limit"
    )
    in_flight_total: Count = Field(default=0, description="Shards in flight in all")
    complete: bool = Field(default=False, description="Every epoch is done")
    incarnation: Count = Field(default=0, description="The ledger's incarnation (restarts)")
    checkpoints: tuple[Count, ...] = Field(default=(), description="Steps with a ledger snapshot")
    pending_checkpoint: Count | None = Field(
        default=None, description="Step of a checkpoint still waiting for some ranks' commits"
    )
    committed_ranks: tuple[Rank, ...] = Field(
        default=(), description="Ranks that committed the pending checkpoint"
    )
    left: tuple[Rank, ...] = Field(default=(), description="Ranks removed from the job")
    owner: str = Field(
        default="",
        max_length=256,
        description="The shards replica that owns the job, which its ranks send their "
        "fetches to; empty: none at the moment",
    )


class ShardPosition(WireModel):
    """How far a rank's model has consumed one held shard (samples of the shard's order)."""

    epoch: Count = Field(description="The epoch the shard was granted in")
    shard: Count = Field(description="Shard index")
    attempt: Count = Field(description="Grant attempt")
    position: Count = Field(description="Samples of the shard that reached the model")


class ShardCommit(WireModel):
    """A rank's part of a checkpoint at `step`: sent after the step's update, before the
    next step takes data. `done` lists every finished shard not yet acknowledged; the
    positions cover every other shard the rank holds. Repeating it is harmless."""

    job: Token = Field(description="Job id; must match the subject's")
    rank: Rank
    incarnation: Incarnation = 0
    step: Count = Field(description="Global step index the model checkpoint is taken after")
    epoch: Count = Field(description="The epoch the rank is working on")
    done: tuple[ShardRef, ...] = Field(
        default=(), max_length=1024, description="Finished grants not yet acknowledged"
    )
    positions: tuple[ShardPosition, ...] = Field(
        default=(), max_length=1024, description="How far the model got in every other held shard"
    )


class CommitReply(WireModel):
    """The shards service's answer to a ShardCommit."""

    job: Token = Field(description="Job id")
    step: Count = Field(description="The checkpoint's step, as committed")
    complete: bool = Field(description="Every rank committed: the snapshot for `step` is stored")
    completed_now: bool = Field(
        default=False,
        description="This commit completed the checkpoint: its snapshot was written with it",
    )
    waiting: Count = Field(default=0, description="How many ranks have yet to commit")
    waiting_for: tuple[Rank, ...] = Field(
        default=(), description="The ranks yet to commit, when there are at most 16 of them"
    )
    checkpoints: tuple[Count, ...] = Field(default=(), description="Steps with a snapshot")


class CheckpointCompleted(WireModel):
    """Published on `{p}.{job}.shards.checkpointed` once the ledger snapshot of checkpoint
    `step` is durable (every active rank committed). Ranks waiting in `commit` ask again
    at once instead of at their next poll; anyone may subscribe (a checkpoint's data
    positions are safe from here on)."""

    job: Token = Field(description="Job id")
    step: Count = Field(description="The checkpoint's step")
    checkpoints: tuple[Count, ...] = Field(default=(), description="Steps with a snapshot")


class EpochFinished(WireModel):
    """Published on `{p}.{job}.shards.epoch` when every shard of `epoch` is done (of the last
    epoch too: the job is done), so that ranks waiting on it ask again at once, not at
    their next poll (seconds away in a large job). May come more than once (a replica
    taking the job on tells the previous end again); best effort: a rank that misses it
    asks at that poll."""

    job: Token = Field(description="Job id")
    epoch: Count = Field(description="The epoch just finished: every shard of it is done")
    incarnation: Count = Field(default=0, description="The ledger's incarnation")


class ShardsReturned(WireModel):
    """Published on `{p}.{job}.shards.returned` when releases handed shards back to be
    granted again (`antdt shards release`, `agent.leave()`), so that ranks waiting to leave
    the epoch ask again at once and train them. At most one a second per job and replica
    (the first at once, later ones gathered); best effort: a rank that misses it asks at
    its next poll."""

    job: Token = Field(description="Job id")
    ranks: tuple[Rank, ...] = Field(
        max_length=1024, description="The ranks released since the last announcement"
    )
    returned: Count = Field(description="Shards they handed back to be granted again")


class ShardRestore(WireModel):
    """Put the ledger back to the snapshot of checkpoint `step` (None: the job's start) and
    start a new incarnation. Every rank of the restarted job sends it with the same
    `token`: the first one restores, the others get the same answer."""

    job: Token = Field(description="Job id; must match the subject's")
    rank: Rank
    token: Token = Field(description="Shared by the ranks of one restart, unique per restart")
    step: Count | None = Field(description="The model checkpoint's step; None: no checkpoint")


class RestoreReply(WireModel):
    """The shards service's answer to a ShardRestore."""

    job: Token = Field(description="Job id")
    incarnation: Count = Field(description="The job's incarnation after the restore")
    step: Count | None = Field(description="The checkpoint restored (null: the job's start)")
    epoch: Count = Field(description="The ledger's epoch after the restore")
    restored: bool = Field(description="False: an earlier request of this incarnation did it")


class ShardRelease(WireModel):
    """Remove `rank` from the job's data without a rollback: its shards go back to be
    granted again. From the rank itself (a graceful leave), `positions` says how far the
    model got in each; from an operator (a dead rank) they resume at its last commit."""

    job: Token = Field(description="Job id; must match the subject's")
    rank: Rank
    incarnation: Incarnation = 0
    done: tuple[ShardRef, ...] = Field(
        default=(), max_length=1024, description="Grants the rank finished, not yet said"
    )
    positions: tuple[ShardPosition, ...] = Field(
        default=(), max_length=1024, description="How far the model got in every other held shard"
    )
    reason: str = Field(default="", max_length=256, description="Why, for people and logs")


class ReleaseReply(WireModel):
    """The shards service's answer to a ShardRelease."""

    job: Token = Field(description="Job id")
    rank: Rank
    returned: Count = Field(description="Shards handed back to be granted again")
