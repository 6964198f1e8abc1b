"""Work sharing inside a step: who offers, and the ticket protocol; pure (no I/O).

A rank whose compute per sample was well above the job's median in the last step offers
its share as micro-batches; every rank learns the offers from the step's count
all-reduce. An offered share has one counter in the claim store: the owner draws tickets
from its front, helpers (ranks done with their own share) from its back
(docs/architecture.md, "Work sharing inside a step")."""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from enum import Enum

#: Micro-batches an offered share is cut into when its plan has no accumulation.
DEFAULT_CHUNKS = 8
#: A rank offers when its share would take this many times the median share's time. At
#: 1.3 the offer roughly breaks even (a share 1.3x the median spread over 4 ranks saves
#: about 0.22 of a step; cut into 8 micro-batches it costs up to 0.14), and 4 ranks on 2
#: shared cores cross 1.3x by noise alone in many healthy steps.
DEFAULT_OFFER_RATIO = 1.5
#: A helper takes tickets on an owner's share only while its claim round trip is under
#: this share of one micro-batch's compute at the owner's pace: a ticket costs the step
#: the round trip, and saves at most the owner's time on the micro-batch. An owner offers
#: only while the round trips of its own tickets are under this share of its excess.
RTT_SHARE = 0.5
#: A rank that offered keeps offering while its share would take this many times the
#: median share's time (or the job's offer ratio, if lower): its helpers' relief and a
#: plan's first cut bring it below the offer ratio well before it is on time, and a rank
#: that stops offering there is the step's slowest again the step after (it offered on
#: every other step).
KEEP_OFFERING_RATIO = 1.1
#: One helper's ticket on an owner's counter; one owner's ticket is 1. Both ends' counts
#: live in one value, so one atomic `add` draws a ticket and reads the other end.
BACK_TICKET = 1 << 32


class Holder(str, Enum):
    """Who computes one offered micro-batch (a diagram).

        UNCLAIMED --front ticket (the owner)--> OWNER
        UNCLAIMED --back ticket (a helper)----> HELPER

    Front ticket f names index f - 1, back ticket b index count - b. A ticket is valid
    iff front + back <= count in the value its `add` returned: of two tickets naming
    one index, the later one sees both and is refused, so exactly one holder wins."""

    OWNER = "owner"
    HELPER = "helper"


class Refusal(str, Enum):
    STEP_OVER = "step_over"  # the step is behind the claimer's open step
    STEP_NOT_OPEN = "step_not_open"  # a step the claimer has not begun
    OUTSIDE_JOB = "outside_job"  # claimer or owner is not a rank of the job
    NOT_OFFERED = "not_offered"  # the owner did not offer its share this step
    ALREADY_CLAIMED = "already_claimed"  # the ticket's micro-batch is the other end's


@dataclass(frozen=True)
class Refused:
    refusal: Refusal
    reason: str


@dataclass(frozen=True)
class StepShare:
    """What every rank knows of a step after its count all-reduce: its index, the job's
    size and, per offering owner, how many micro-batches its share was cut into."""

    step: int
    world: int
    counts: Mapping[int, int]


def check_claim(share: StepShare, rank: int, step: int, owner: int) -> Refused | None:
    """Why `rank` may not draw a ticket on `owner`'s share in `step`, or None."""
    if not (0 <= rank < share.world and 0 <= owner < share.world):
        return Refused(Refusal.OUTSIDE_JOB, f"rank {rank} or owner {owner}")
    if step < share.step:
        return Refused(Refusal.STEP_OVER, f"step {step} is over (open: {share.step})")
    if step > share.step:
        return Refused(Refusal.STEP_NOT_OPEN, f"step {step} (open: {share.step})")
    if share.counts.get(owner, 0) == 0:
        return Refused(Refusal.NOT_OFFERED, f"rank {owner} offered nothing in step {step}")
    return None


def split(value: int) -> tuple[int, int]:
    """A counter's (front, back) tickets drawn."""
    return value % BACK_TICKET, value // BACK_TICKET


def owner_indices(count: int, value: int, drawn: int) -> range:
    """The indices an owner holds from `drawn` front tickets whose `add` returned
    `value`: front tickets f - drawn + 1 .. f name f - drawn .. f - 1; those at or past
    count - back are the helpers'."""
    front, back = split(value)
    return range(front - drawn, max(front - drawn, min(front, count - back)))


def helper_index(count: int, value: int) -> int | Refused:
    """The index a helper holds from the back ticket whose `add` returned `value`."""
    front, back = split(value)
    if front + back > count:
        return Refused(Refusal.ALREADY_CLAIMED, f"front {front} + back {back} > {count}")
    return count - back


def furthest_behind(
    share: StepShare, rank: int, values: Mapping[int, int], exhausted: set[int]
) -> int | None:
    """The owner to help: the most micro-batches without a ticket (`values`: counters
    of the offering owners), ties to the lowest rank; None when none has any left."""
    best, most = None, 0
    for owner in sorted(share.counts):
        if owner == rank or owner in exhausted:
            continue
        left = share.counts[owner] - sum(split(values.get(owner, 0)))
        if left > most:
            best, most = owner, left
    return best


@dataclass(frozen=True)
class Pace:
    """A rank's compute seconds per sample in its last step (0: none): on its own share
    (in one piece, or in micro-batches when it offered) and on micro-batches it took over."""

    own: float = 0.0
    helping: float = 0.0


def offering(
    paces: Sequence[Pace],
    offered: AbstractSet[int],
    samples: Sequence[int],
    ratio: float,
    round_trips: Sequence[float] = (),
    chunks: int = DEFAULT_CHUNKS,
) -> frozenset[int]:
    """The ranks that offer their share: those whose share (`samples` this step) would
    take above `ratio` x the median share's time at their last pace (above
    KEEP_OFFERING_RATIO x for those that `offered` last step), unless its `chunks`
    tickets' claim round trips (`round_trips`, seconds, by rank; none: free) come to
    RTT_SHARE of its excess over the median or more. A share cut into
    micro-batches costs more per sample than one in one piece, so the pace of a rank
    that `offered` last step (measured on its micro-batches) is scaled by the helpers'
    median ratio of their pace in one piece to theirs on micro-batches; no helper, no
    offer. A rank's pace 0 (none yet, e.g. the first step): not judged, no reference."""
    in_one_piece = one_piece_scale(paces, offered)
    times = {
        r: p.own * (in_one_piece if r in offered else 1.0) * samples[r]
        for r, p in enumerate(paces)
        if p.own > 0 and samples[r] > 0
    }
    known = [t for t in times.values() if t > 0]
    if len(known) < 2:
        return frozenset()
    median = statistics.median(known)
    rtt = dict(enumerate(round_trips))
    keep = min(ratio, KEEP_OFFERING_RATIO)
    return frozenset(
        r
        for r, t in times.items()
        if t > (keep if r in offered else ratio) * median
        and chunks * rtt.get(r, 0.0) < RTT_SHARE * (t - median)
    )


def one_piece_scale(paces: Sequence[Pace], offered: AbstractSet[int]) -> float:
    """Pace in one piece over pace on micro-batches, as the ranks that helped without
    offering measured both last step (their median); 0 when none did."""
    scale = [p.own / p.helping for r, p in enumerate(paces) if r not in offered and p.helping > 0]
    return statistics.median(scale) if scale else 0.0


def worth_helping(round_trip_s: float, micro_samples: int, owner_pace: float) -> bool:
    """Whether a helper whose claim takes `round_trip_s` seconds takes tickets on an
    owner whose micro-batches hold `micro_samples` samples at `owner_pace` seconds per
    sample (its last step's; 0: unknown, and helped)."""
    return owner_pace <= 0 or round_trip_s < RTT_SHARE * micro_samples * owner_pace


@dataclass(frozen=True)
class Lane:
    """A helper as an owner sees it in a step: when it will be done with its own share
    and what one of the owner's micro-batches costs it (compute and ticket), seconds on
    the owner's clock."""

    free_at: float
    micro_s: float


def helper_lanes(
    paces: Sequence[Pace],
    offered: AbstractSet[int],
    samples: Sequence[int],
    round_trips: Sequence[float],
    micro: int,
    start: float,
) -> list[Lane]:
    """The ranks that will help this step (those that did not offer, with a known pace),
    from their last step: each free at `start` plus its share (`samples`) at its own pace,
    then taking `micro`-sample micro-batches at its pace on others' micro-batches (its own
    pace over the job's one-piece ratio when it helped nobody last step)."""
    scale = one_piece_scale(paces, offered)
    rtt = dict(enumerate(round_trips))
    lanes = []
    for r, p in enumerate(paces):
        if r in offered or p.own <= 0:
            continue
        helping = p.helping if p.helping > 0 else p.own / (scale if scale > 0 else 1.0)
        lanes.append(Lane(start + p.own * samples[r], helping * micro + rtt.get(r, 0.0)))
    return lanes


def helpers_done(now: float, remaining: int, lanes: Sequence[Lane]) -> float:
    """When `lanes` would have `remaining` micro-batches computed, each going to the
    helper that would finish it first (no lane: never)."""
    if remaining <= 0:
        return now
    if not lanes:
        return math.inf
    ends = [(max(now, lane.free_at) + lane.micro_s, i) for i, lane in enumerate(lanes)]
    heapq.heapify(ends)
    done = now
    for _ in range(remaining):
        end, i = heapq.heappop(ends)
        done = max(done, end)
        heapq.heappush(ends, (end + lanes[i].micro_s, i))
    return done


def holds_back(now: float, own_micro_s: float, remaining: int, lanes: Sequence[Lane]) -> bool:
    """Whether an owner leaves its next micro-batch to the helpers for now: they would
    have all `remaining` computed before it finished that one (`own_micro_s`, its ticket
    included), so taking it could only make it the step's last rank. Taking it ends the
    share at max(now + own_micro_s, helpers_done(remaining - 1)); leaving it, at
    helpers_done(remaining), which is never below the latter."""
    return remaining > 0 and now + own_micro_s > helpers_done(now, remaining, lanes)


def micro_samples(samples: int, micro_batch: int, chunks: int) -> int:
    """Samples in the first micro-batch `cut` makes of a share of `samples`."""
    return max(1, micro_batch if micro_batch > 0 else math.ceil(samples / max(1, chunks)))


def cut(ids: Sequence[int], micro_batch: int, chunks: int = DEFAULT_CHUNKS) -> list[list[int]]:
    """A rank's ids as micro-batches: of the plan's `micro_batch` when it has
    accumulation (> 0), else `chunks` nearly equal ones. Empty ids: none."""
    size = micro_samples(len(ids), micro_batch, chunks)
    return [list(ids[i : i + size]) for i in range(0, len(ids), size)]


#: Policies under which `work_sharing` is on unless the job's params turn it off.
SHARING_BY_DEFAULT: frozenset[str] = frozenset({"antdt-nd"})


#: The head of a share that may be offered late, as a part of the share. A quarter: a
#: rank 3x slow learns it at three quarters of a healthy share's time, before its
#: helpers are done with their own (a half made them wait for the decision), and the
#: tail it offers is three quarters of its share. A pass over a quarter costs about
#: what a quarter of a pass over the whole does (CPU MLP: the two passes 1.00-1.02x).
HEAD_SHARE = 4
#: A head must run this many times the median pace before its tail is offered (or the
#: job's `share_ratio`, if higher): a quarter of a share is short enough for noise to
#: cross 1.5x, and a tail offered for nothing is paid in micro-batches.
LATE_RATIO = 2.0


def head_size(samples: int) -> int:
    """The head of a share that may be offered late: its first quarter. A rank computes
    its head in one piece, then knows its pace this step; 0 when there is nothing to
    split."""
    return samples // HEAD_SHARE if samples >= 2 else 0


#: Up to this many ranks, the late deciders go in one number of the count (a bit each).
LATE_BITS = 62


def late_slots(world: int, rank: int, late: bool) -> list[int]:
    """A rank's part of the count's late-decider slots: one bitmask for a job of up to
    LATE_BITS ranks (each number of an all-reduce costs latency), else a slot per rank."""
    if world <= LATE_BITS:
        return [int(late) << rank]
    slots = [0] * world
    slots[rank] = int(late)
    return slots


def read_late_slots(summed: Sequence[int], world: int) -> frozenset[int]:
    """The ranks that may decide late, from the summed `late_slots` (none: no slots)."""
    if not summed:
        return frozenset()
    if world <= LATE_BITS:
        return frozenset(r for r in range(world) if summed[0] >> r & 1)
    return frozenset(r for r in range(world) if summed[r])


def late_offer(head_s: float, head_samples: int, paces: Sequence[Pace], ratio: float) -> bool:
    """Whether a rank offers the rest of its share (its tail) in the middle of the step:
    its head took above `ratio` (at least LATE_RATIO) x the median pace of the ranks' last
    step per sample. A burst's first step is thus shared too, where offers at the step's
    start come one step late. No known pace (the first step): no offer."""
    limit = late_pace_limit(paces, ratio)
    return head_samples > 0 and limit is not None and head_s / head_samples > limit


def late_pace_limit(paces: Sequence[Pace], ratio: float) -> float | None:
    """The pace per sample (seconds) above which a head offers its tail (`late_offer`),
    the same for every rank of a step; None when fewer than two paces are known."""
    known = [p.own for p in paces if p.own > 0]
    if len(known) < 2:
        return None
    return max(ratio, LATE_RATIO) * statistics.median(known)


def _flag(params: Mapping[str, float | int | str | bool], name: str, default: bool) -> bool:
    raw = params.get(name, default)
    if isinstance(raw, str):
        if raw.lower() not in ("on", "off", "true", "false"):
            raise ValueError(f"policy param {name}={raw!r}: expected on or off")
        return raw.lower() in ("on", "true")
    if not isinstance(raw, bool):
        raise ValueError(f"policy param {name}={raw!r}: expected on or off")
    return raw


@dataclass(frozen=True)
class ShareParams:
    """The job's `work_sharing` (on/off; default on under the policies in
    SHARING_BY_DEFAULT, else off), `share_chunks`, `share_ratio`, `share_route` (on/off,
    default on: the step's collectives routed around its offering ranks) and `share_late` (on/off,
    default off: offers in the middle of a step too) policy params."""

    enabled: bool = False
    chunks: int = DEFAULT_CHUNKS
    ratio: float = DEFAULT_OFFER_RATIO
    late: bool = False
    route: bool = True

    @classmethod
    def from_params(
        cls, params: Mapping[str, float | int | str | bool], policy: str = "none"
    ) -> ShareParams:
        enabled = _flag(params, "work_sharing", policy in SHARING_BY_DEFAULT)
        late = _flag(params, "share_late", False)
        route = _flag(params, "share_route", True)
        chunks = params.get("share_chunks", DEFAULT_CHUNKS)
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"policy param share_chunks={chunks!r}: expected an int >= 1")
        ratio = params.get("share_ratio", DEFAULT_OFFER_RATIO)
        if isinstance(ratio, (bool, str)) or not ratio >= 1.0:
            raise ValueError(f"policy param share_ratio={ratio!r}: expected a number >= 1")
        return cls(enabled, chunks, float(ratio), late, route)
