"""Work sharing inside a step: the claim protocol, pure (no I/O; time is an argument).

Each rank's share of a step is a list of micro-batches. A rank claims a micro-batch
before computing it: its own next one, else the last unclaimed one of the rank with the
most left. A claim is the one transition UNCLAIMED -> CLAIMED(rank), made atomic by the
claim store's compare-and-set (docs/architecture.md, "Work sharing")."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

#: Micro-batches a rank's batch is cut into when its plan has no accumulation.
DEFAULT_CHUNKS = 4


class ClaimState(str, Enum):
    """One micro-batch's claim in one step, a diagram.

        UNCLAIMED --claim(r)--> CLAIMED(r) --done(r)--> DONE(r)

    Only an UNCLAIMED micro-batch can be claimed, by one rank (the store's compare-and-
    set picks it); only its claimer marks it DONE. Nothing goes back: a step ends (the
    gradient all-reduce) once every micro-batch is DONE."""

    UNCLAIMED = "u"
    CLAIMED = "c"
    DONE = "d"


@dataclass(frozen=True)
class Claim:
    """The record of one micro-batch's claim; `rank` and `at` are None while UNCLAIMED."""

    state: ClaimState = ClaimState.UNCLAIMED
    rank: int | None = None
    at: float | None = None

    def encode(self) -> str:
        """The store's value: "" for UNCLAIMED (a missing key), else "c3@12.5" style."""
        if self.state is ClaimState.UNCLAIMED:
            return ""
        return f"{self.state.value}{self.rank}@{self.at!r}"

    @classmethod
    def decode(cls, text: str) -> Claim:
        if not text:
            return cls()
        rank, at = text[1:].split("@", 1)
        return cls(ClaimState(text[0]), int(rank), float(at))


class Op(str, Enum):
    CLAIM = "claim"
    DONE = "done"


@dataclass(frozen=True)
class ClaimEvent:
    """`rank` asks to claim (or to mark done) micro-batch `index` of `owner` in `step`."""

    op: Op
    rank: int
    step: int
    owner: int
    index: int


class Refusal(str, Enum):
    STEP_OVER = "step_over"  # the step is behind the claimer's open step
    STEP_NOT_OPEN = "step_not_open"  # a step the claimer has not begun
    OUTSIDE_JOB = "outside_job"  # claimer or owner is not a rank of the job
    NO_SUCH_MICRO_BATCH = "no_such_micro_batch"
    ALREADY_CLAIMED = "already_claimed"
    NOT_CLAIMER = "not_claimer"  # done by a rank that does not hold the claim


@dataclass(frozen=True)
class Refused:
    refusal: Refusal
    reason: str


@dataclass(frozen=True)
class StepShare:
    """What a rank knows of a step: its index, the job's size and, per rank, how many
    micro-batches it was cut into (every rank publishes its own)."""

    step: int
    world: int
    counts: Mapping[int, int]


def transition(share: StepShare, claim: Claim, event: ClaimEvent, now: float) -> Claim | Refused:
    """The claim's next record after `event` at time `now`, or why the event is refused."""
    if not (0 <= event.rank < share.world and 0 <= event.owner < share.world):
        return Refused(Refusal.OUTSIDE_JOB, f"rank {event.rank} or owner {event.owner}")
    if event.step < share.step:
        return Refused(Refusal.STEP_OVER, f"step {event.step} is over (open: {share.step})")
    if event.step > share.step:
        return Refused(Refusal.STEP_NOT_OPEN, f"step {event.step} (open: {share.step})")
    count = share.counts.get(event.owner, 0)
    if not 0 <= event.index < count:
        return Refused(Refusal.NO_SUCH_MICRO_BATCH, f"rank {event.owner} has {count}")
    if event.op is Op.CLAIM:
        if claim.state is not ClaimState.UNCLAIMED:
            return Refused(Refusal.ALREADY_CLAIMED, f"{claim.state.value} by rank {claim.rank}")
        return Claim(ClaimState.CLAIMED, event.rank, now)
    if claim.state is not ClaimState.CLAIMED or claim.rank != event.rank:
        return Refused(Refusal.NOT_CLAIMER, f"{claim.state.value} by rank {claim.rank}")
    return Claim(ClaimState.DONE, event.rank, now)


def furthest_behind(
    share: StepShare, rank: int, taken: Sequence[int], exhausted: set[int]
) -> int | None:
    """The rank to help: the most micro-batches not yet taken (`taken[o]`: tickets drawn
    on owner o from either end), ties to the lowest rank; None when no other has any."""
    best, most = None, 0
    for owner in range(share.world):
        if owner == rank or owner in exhausted:
            continue
        left = share.counts.get(owner, 0) - taken[owner]
        if left > most:
            best, most = owner, left
    return best


def stolen_index(count: int, ticket: int) -> int:
    """Helpers take an owner's micro-batches from its last one down (ticket 0 is the
    last), so the owner's own order, from the front, is kept; < 0: none left there."""
    return count - 1 - ticket


def cut(ids: Sequence[int], micro_batch: int, chunks: int = DEFAULT_CHUNKS) -> list[list[int]]:
    """A rank's ids as micro-batches: of the plan's `micro_batch` when it has
    accumulation (> 0), else `chunks` nearly equal ones. Empty ids: none."""
    size = micro_batch if micro_batch > 0 else math.ceil(len(ids) / max(1, chunks))
    size = max(1, size)
    return [list(ids[i : i + size]) for i in range(0, len(ids), size)]


#: Policies under which `work_sharing` is on unless the job's params turn it off: none
#: while sharing costs a healthy job more than it may (bench/sharing.py's healthy case).
SHARING_BY_DEFAULT: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ShareParams:
    """The job's `work_sharing` (on/off; default on under the policies in
    SHARING_BY_DEFAULT, else off) and `share_chunks` policy params."""

    enabled: bool = False
    chunks: int = DEFAULT_CHUNKS

    @classmethod
    def from_params(
        cls, params: Mapping[str, float | int | str | bool], policy: str = "none"
    ) -> ShareParams:
        raw = params.get("work_sharing", policy in SHARING_BY_DEFAULT)
        if isinstance(raw, str):
            if raw.lower() not in ("on", "off", "true", "false"):
                raise ValueError(f"policy param work_sharing={raw!r}: expected on or off")
            raw = raw.lower() in ("on", "true")
        chunks = params.get("share_chunks", DEFAULT_CHUNKS)
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"policy param share_chunks={chunks!r}: expected an int >= 1")
        return cls(bool(raw), chunks)
