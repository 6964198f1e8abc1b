"""The job's health, published by the monitor at 1 Hz: the job's figures, and its ranks'
as columns, one list per figure with an entry per rank. At 10,000 ranks that is half
the JSON of a row object per rank, and a receiver (the controller, once a second per
job) validates it in ~9 ms where the rows took ~31."""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from enum import Enum
from typing import Annotated, Any, ClassVar

from pydantic import Field, TypeAdapter, field_validator, model_validator

from antdt.schemas.base import (
    MAX_HEALTH_BYTES,
    Count,
    Rank,
    Timestamp,
    Token,
    WireModel,
    trusted,
    unset,
)

NonNegative = Annotated[float, Field(ge=0)]
Share = Annotated[float, Field(ge=0, le=1)]
Host = Annotated[str, Field(max_length=128)]
#: Samples of other ranks' shares a rank computed, by owner rank.
OwnerCounts = Annotated[dict[Rank, Count], Field(max_length=4096)]


class RankState(str, Enum):
    """How the monitor sees one rank right now."""

    OK = "ok"
    SLOW = "slow"
    LEADER = "leader"
    STALLED = "stalled"
    UNKNOWN = "unknown"
    EXITED = "exited"  # its process finished or closed (RankExit)
    RESTARTING = "restarting"  # its process exited to be restarted (RankExit)


class RankHealth(WireModel):
    """One rank's figures in a JobHealth: what `RankColumns` gives for an index. Not a
    message of its own; JobHealth also accepts a list of them for its `ranks`."""

    rank: Rank
    host: Host = Field(description="Host (node) the rank runs on")
    state: RankState = Field(description="How the monitor sees the rank now")
    last_step: Count = Field(description="Latest step heard from the rank")
    local_batch: Count = Field(description="Local batch of its last step")
    samples_per_s: NonNegative = Field(description="Compute throughput, samples per second")
    compute_s_per_sample: NonNegative = Field(description="Median over the window, seconds")
    ratio: NonNegative = Field(
        description="The rank's level (its recent best compute cost per sample, fixed "
        "per-step part included) over the job's healthy reference (the median of the faster "
        "half of the ranks' levels), at the plan in force (plan_version); see Incident.ratio",
    )
    data_wait_share: Share = Field(description="Share of step time waiting for data")
    comm_share: Share = Field(description="Share of step time in gradient exchange")
    fixed_s: NonNegative | None = Field(
        default=None,
        exclude_if=unset,
        description="The rank's speed model: compute seconds per step whatever its batch "
        "(null: not fitted yet); a step's compute is fixed_s + per_sample_s * batch",
    )
    per_sample_s: NonNegative | None = Field(
        default=None,
        exclude_if=unset,
        description="The rank's speed model: compute seconds per sample (null: not fitted)",
    )
    helped: OwnerCounts | None = Field(
        default=None,
        exclude_if=unset,
        description="Under work sharing: samples of other ranks' shares this rank computed "
        "since the monitor took the job, by owner rank (null: none)",
    )


#: The most ranks a health carries: JobSpec's largest world size.
MAX_RANKS = 100_000
#: RankColumns' columns, each RankHealth's field of the same name, in its order (a
#: rank's `helped` is a mapping by rank beside them).
COLUMNS = tuple(n for n in RankHealth.model_fields if n not in ("schema_version", "helped"))


def _column(name: str) -> Any:
    """A column of RankHealth's field `name`, described as that field."""
    return Field(description=f"Per rank: {RankHealth.model_fields[name].description or name}")


class RankColumns(WireModel):
    """JobHealth's ranks: entry i of every column is the rank `rank[i]`'s (the monitor
    sends every rank of the job, in rank order). In Python it reads as a sequence of
    RankHealth rows as well (`len`, indexing, iteration), each row made when asked."""

    rank: tuple[Rank, ...] = Field(
        max_length=MAX_RANKS, description="Per rank: its index in the job, each once"
    )
    host: tuple[Host, ...] = _column("host")
    state: tuple[RankState, ...] = _column("state")
    last_step: tuple[Count, ...] = _column("last_step")
    local_batch: tuple[Count, ...] = _column("local_batch")
    samples_per_s: tuple[NonNegative, ...] = _column("samples_per_s")
    compute_s_per_sample: tuple[NonNegative, ...] = _column("compute_s_per_sample")
    ratio: tuple[NonNegative, ...] = _column("ratio")
    data_wait_share: tuple[Share, ...] = _column("data_wait_share")
    comm_share: tuple[Share, ...] = _column("comm_share")
    fixed_s: tuple[NonNegative | None, ...] = _column("fixed_s")
    per_sample_s: tuple[NonNegative | None, ...] = _column("per_sample_s")
    helped: dict[Rank, OwnerCounts] | None = Field(
        default=None,
        exclude_if=unset,
        description="Under work sharing, by rank (only those that computed any): samples "
        "of other ranks' shares it computed since the monitor took the job, by owner rank "
        "(null: no rank did)",
    )

    @model_validator(mode="after")
    def _aligned(self) -> RankColumns:
        size = len(self.rank)
        uneven = [name for name in COLUMNS if len(getattr(self, name)) != size]
        if uneven:
            raise ValueError(f"columns {uneven} do not have one entry per rank ({size})")
        ranks = set(self.rank)
        if len(ranks) != size:
            raise ValueError("a rank has more than one entry in the columns")
        if self.helped and not set(self.helped) <= ranks:
            raise ValueError("helped names a rank that has no entry in the columns")
        return self

    @classmethod
    def of_rows(cls, rows: Sequence[RankHealth]) -> RankColumns:
        """The columns of `rows` (valid RankHealth rows: nothing to check again)."""
        values: dict[str, Any] = {name: tuple(getattr(r, name) for r in rows) for name in COLUMNS}
        helped = {r.rank: r.helped for r in rows if r.helped}
        values["helped"] = helped or None
        return trusted(cls, values)

    def __len__(self) -> int:
        return len(self.rank)

    def __getitem__(self, index: int) -> RankHealth:
        """Row `index` (negative counts from the end; a slice is a TypeError)."""
        index = operator.index(index)
        values = {name: getattr(self, name)[index] for name in COLUMNS}
        values["helped"] = self.helped.get(values["rank"]) if self.helped else None
        return trusted(RankHealth, values)

    def __iter__(self) -> Iterator[RankHealth]:  # type: ignore[override]
        """The rows in order (a pydantic model iterates its fields otherwise)."""
        return map(self.__getitem__, range(len(self.rank)))


class JobHealth(WireModel):
    """Published by the monitor at 1 Hz for every job it owns. Its ranks' figures grow
    with the job (~170 bytes a rank): over 64 KiB it travels gzipped
    (`Content-Encoding: gzip`)."""

    #: Its columns grow with the job: accepted up to this size (inflated), not 256 KiB.
    max_message_bytes: ClassVar[int] = MAX_HEALTH_BYTES

    job: Token = Field(description="Job id")
    at: Timestamp
    step: Count = Field(description="Latest step seen from any rank")
    step_s: float = Field(ge=0, description="Median step wall time over the window, seconds")
    samples_per_s: float = Field(ge=0, description="Job throughput over the window")
    balance_efficiency: float = Field(
        ge=0,
        le=1,
        description="T_ideal / T_step: the step time were the batch split by speed, over the "
        "measured one; 1 = perfectly balanced",
    )
    plan_version: Count = Field(
        description="Version of the plan the latest steps ran under (Plan.version)"
    )
    ranks: RankColumns = Field(
        description="Every rank of the job, as columns (a list of RankHealth rows, the "
        "form before 2026-12-01, is accepted too)"
    )
    open_incidents: tuple[str, ...] = Field(
        default=(), description="Ids of the job's incidents not resolved yet"
    )

    @field_validator("ranks", mode="before")
    @classmethod
    def _rows_as_columns(cls, value: object) -> object:
        """A list of rows (RankHealth, or their fields) as their columns."""
        if isinstance(value, list | tuple):
            return RankColumns.of_rows(_ROWS.validate_python(value))
        return value


_ROWS = TypeAdapter(tuple[RankHealth, ...])
