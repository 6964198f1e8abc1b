"""Agent ↔ shards service: done-and-fetch in one request (DESIGN.md section 6)."""

from __future__ import annotations

from enum import Enum

from pydantic import Field, model_validator

from antdt.schemas.base import Count, Rank, Token, WireModel


class ShardRef(WireModel):
    """Names one grant of one shard in one epoch."""

    epoch: Count
    shard: Count = Field(description="Shard index in [0, ceil(dataset_size / shard_size))")
    attempt: Count = Field(description="Grant attempt; bumps when a shard is re-granted")


class ShardGrant(WireModel):
    """A shard handed to a rank: sample ids [start, end), to be consumed from `position`."""

    epoch: Count
    shard: Count
    attempt: Count
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
        return ShardRef(epoch=self.epoch, shard=self.shard, attempt=self.attempt)


class ShardFetch(WireModel):
    """Report finished shards and ask for up to `want` more, in one request."""

    job: Token
    rank: Rank
    epoch: Count = Field(description="The epoch the rank is working on")
    done: tuple[ShardRef, ...] = Field(default=(), max_length=64)
    want: int = Field(default=1, ge=0, le=8, description="New grants wanted")


class FetchStatus(str, Enum):
    """OK: grants attached (maybe fewer than wanted). EPOCH_DONE: no shard of the epoch is
    left to grant (others may still be in flight). PENDING: the rank asked for the next
    epoch while the current one still has shards in flight: retry after retry_after_s.
    JOB_DONE: every epoch is complete."""

    OK = "ok"
    EPOCH_DONE = "epoch_done"
    PENDING = "pending"
    JOB_DONE = "job_done"


class ShardReply(WireModel):
    job: Token
    epoch: Count = Field(description="The ledger's current epoch")
    status: FetchStatus
    grants: tuple[ShardGrant, ...] = ()
    retry_after_s: float = Field(default=0.0, ge=0, le=60)


class ShardStatusRequest(WireModel):
    job: Token


class InFlight(WireModel):
    rank: Rank
    shard: Count
    attempt: Count
    position: Count


class ShardStatus(WireModel):
    """Progress of the job's current epoch (for `antdt shards status`)."""

    job: Token
    epoch: Count
    num_shards: Count
    done: Count
    todo: Count
    in_flight: tuple[InFlight, ...]
