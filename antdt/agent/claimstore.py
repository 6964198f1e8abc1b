"""The ticket protocol (antdt.sharing) on torch's c10d store, the one every job
already has (TCPStore behind init_process_group / torchrun). Per offering owner: its ids
(in one of two slots, tagged with the step) and, per step, one counter whose `add`s draw
front and back tickets; per offering owner whose collectives are routed, its part of the
step's count and the sum its partner posts back (two slots each). A step without offers
touches the store not at all; an owner deletes its counter of the last step it offered
in when it offers again, so the store holds at most seven keys per owner."""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from antdt.sharing import (
    BACK_TICKET,
    Holder,
    Refused,
    StepShare,
    check_claim,
    cut,
    furthest_behind,
    helper_index,
    micro_samples,
    owner_indices,
    split,
    worth_helping,
)

#: Seconds between reads of an owner's ids slot that still holds an older step's.
PUBLISH_POLL_S = 0.0005
#: A count's tag: its number (counts opened, the same on every rank), epoch and step.
CountTag = tuple[int, int, int]
#: Tickets whose round trips the estimate keeps: the fastest of them is the link's floor
#: (a wait that the rank's CPU budget throttled inflates some trips, never all).
TRIPS_KEPT = 8


@dataclass(frozen=True)
class Claimed:
    """A micro-batch this rank holds: whose, which, its ids and who holds it."""

    owner: int
    index: int
    ids: list[int]
    holder: Holder


class StoreClaims:
    """One rank's client of the claim store; the training thread's only, one step at a
    time (`open`). `store`: a c10d Store (TCPStore, PrefixStore, ...). `round_trip_s`:
    its round trip to the store, the fastest of its last TRIPS_KEPT tickets' (0 until
    the first: a step without offers touches no store)."""

    def __init__(self, store: Any, rank: int, world: int, prefix: str = "antdt/share") -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is outside a job of {world} ranks")
        self._store, self.rank, self.world, self._prefix = store, rank, world, prefix
        self.share = StepShare(-1, world, {})
        self._sizes: dict[int, tuple[int, int]] = {}  # owner -> (samples, micro_batch)
        self._chunks = 1
        self._batches: dict[int, list[list[int]]] = {}
        self._own_left = False
        self.own_unclaimed = 0  # of this rank's offer, as its last add of its counter read
        self._exhausted: set[int] = set()
        self._last_offer: int | None = None
        self._deciders: frozenset[int] = frozenset()  # may offer late in the open step
        self._decided = False  # this rank's late decision is made (or it had none)
        self._joined = False  # the open step's late offers were read
        self._late_steps: set[int] = set()  # steps with deciders whose keys may be left
        self._paces: dict[int, float] = {}  # owner -> its last step's seconds per sample
        self._trips: deque[float] = deque(maxlen=TRIPS_KEPT)

    @property
    def round_trip_s(self) -> float:
        return min(self._trips, default=0.0)

    def _add(self, key: str, amount: int) -> int:
        """The store's `add`, its round trip kept for `round_trip_s`."""
        t0 = time.perf_counter()
        value = int(self._store.add(key, amount))
        self._trips.append(time.perf_counter() - t0)
        return value

    def _counter(self, step: int, owner: int) -> str:
        return f"{self._prefix}/n/{step}/{owner}"

    def _ids_key(self, step: int, owner: int) -> str:
        return f"{self._prefix}/ids/{step % 2}/{owner}"

    def _late_key(self, step: int, what: str) -> str:
        return f"{self._prefix}/late/{step}/{what}"

    def _count_key(self, what: str, count: int, owner: int) -> str:
        return f"{self._prefix}/count/{what}/{count % 2}/{owner}"

    def post_part(self, tag: CountTag, vector: list[int]) -> None:
        """Post this offering rank's part of the count tagged `tag` (its number, the same
        on every rank, its epoch and step), for its partner to add (routing.py)."""
        self._post(self._count_key("part", tag[0], self.rank), tag, vector)

    def read_part(self, tag: CountTag, owner: int) -> list[int]:
        """`owner`'s part of the count tagged `tag` (waits until it is posted)."""
        return self._read(self._count_key("part", tag[0], owner), tag)

    def post_sum(self, tag: CountTag, owner: int, vector: list[int]) -> None:
        """Post the sum of the count tagged `tag` for `owner`, whose partner this rank is."""
        self._post(self._count_key("sum", tag[0], owner), tag, vector)

    def read_sum(self, tag: CountTag) -> list[int]:
        """The sum of the count tagged `tag`, as this rank's partner posted it (waits)."""
        return self._read(self._count_key("sum", tag[0], self.rank), tag)

    def _post(self, key: str, tag: CountTag, vector: list[int]) -> None:
        self._store.set(key, json.dumps([list(tag), vector]))

    def _read(self, key: str, tag: CountTag) -> list[int]:
        """The vector posted under `key` for `tag`: in one of two slots, until it is
        posted the slot is missing (the store's get waits) or holds another count's
        (read again)."""
        wanted = list(tag)
        while (tagged := json.loads(self._store.get(key)))[0] != wanted:
            time.sleep(PUBLISH_POLL_S)
        return [int(v) for v in tagged[1]]

    def open(
        self,
        step: int,
        offers: Mapping[int, tuple[int, int]],
        chunks: int,
        own: list[int] | None = None,
        deciders: frozenset[int] = frozenset(),
        paces: Mapping[int, float] | None = None,
    ) -> None:
        """Open `step` with the offers every rank learnt from its count all-reduce:
        owner -> (its samples, its plan's micro-batch, 0 for none). An offering rank
        passes its `own` ids: published here, its counter of the last offer deleted
        (every rank passed that step's gradient all-reduce, after its last ticket).
        `deciders`: the ranks that decide after their head whether to offer their tail
        (`decide_late`); rank 0 deletes the late keys of two steps before. `paces`: the
        owners' seconds per sample in their last step (a helper skips an owner whose
        micro-batch takes less than its round trip is worth; unknown: helped)."""
        self._sizes, self._chunks = dict(offers), chunks
        self._paces = dict(paces or {})
        counts = {o: len(cut(range(n), micro, chunks)) for o, (n, micro) in offers.items()}
        self.share = StepShare(step, self.world, {o: c for o, c in counts.items() if c})
        self._batches, self._exhausted = {}, set()
        self._own_left = self.rank in self.share.counts
        self.own_unclaimed = self.share.counts.get(self.rank, 0)
        if self._own_left:
            assert own is not None and len(own) == offers[self.rank][0]
            self._publish(step, own, offers[self.rank][1])
        self._deciders, self._joined = deciders, not (deciders - {self.rank})
        self._decided = self.rank not in deciders
        if self.rank == 0:
            self._forget_late(step)

    def _publish(self, step: int, ids: list[int], micro: int) -> None:
        self._batches[self.rank] = cut(ids, micro, self._chunks)
        self._store.set(self._ids_key(step, self.rank), json.dumps([step, ids]))
        if self._last_offer is not None:
            self._store.delete_key(self._counter(self._last_offer, self.rank))
        self._last_offer = step

    def _forget_late(self, step: int) -> None:
        """Delete the late keys of the steps with deciders before `step` - 1: every rank
        passed their gradient all-reduce, after its last read of them."""
        if self._deciders:
            self._late_steps.add(step)
        for old in [s for s in self._late_steps if s < step - 1]:
            self._late_steps.discard(old)
            for what in ("decided", "all", "offers"):
                self._store.delete_key(self._late_key(old, what))

    def decide_late(self, tail: list[int] | None, pace: float = 0.0) -> None:
        """Decide, once in the open step, whether to offer `tail` (the rest of this
        rank's share, published first, with `pace`: its seconds per sample on its head)
        or nothing (None). The last decider's count tells every helper how many offered
        (one key that every helper's `get` waits on)."""
        step = self.share.step
        if self._decided:
            return
        self._decided = True
        offered = 0
        if tail:
            self._sizes[self.rank] = (len(tail), 0)
            self._publish(step, tail, 0)
            count = len(self._batches[self.rank])
            self.share = StepShare(step, self.world, {**self.share.counts, self.rank: count})
            self._own_left = True
            entry = f"{self.rank}:{len(tail)}:{round(pace * 1e9)};"
            self._store.append(self._late_key(step, "offers"), entry)
            offered = BACK_TICKET
        value = self._add(self._late_key(step, "decided"), 1 + offered)
        decided, offers = split(value)
        if decided == len(self._deciders):
            self._store.set(self._late_key(step, "all"), str(offers))

    def join_late(self) -> bool:
        """Once a step, with this rank's own work done: wait until every decider decided,
        then add their late offers to the open step's; whether any other rank offered."""
        if self._joined:
            return False
        self._joined = True
        self.decide_late(None)  # a decider that never reached its decision offers nothing
        step = self.share.step
        if int(self._store.get(self._late_key(step, "all"))) == 0:
            return False
        added = {}
        for entry in self._store.get(self._late_key(step, "offers")).decode().split(";"):
            if entry:
                owner, samples, pace_ns = (int(x) for x in entry.split(":"))
                if owner != self.rank:
                    self._sizes[owner] = (samples, 0)
                    self._paces[owner] = pace_ns / 1e9  # this step's: it made the offer
                    added[owner] = len(cut(range(samples), 0, self._chunks))
        self.share = StepShare(step, self.world, {**self.share.counts, **added})
        return bool(added)

    @property
    def offered(self) -> bool:
        return self.rank in self.share.counts

    def claim_own(self, step: int, drawn: int = 1) -> list[Claimed]:
        """Draw `drawn` front tickets on this rank's share: the micro-batches they name
        that no helper holds (fewer than drawn, or none, once the ends met)."""
        refused = check_claim(self.share, self.rank, step, self.rank)
        if refused is not None or not self._own_left:
            return []
        count = self.share.counts[self.rank]
        value = self._add(self._counter(step, self.rank), drawn)
        held = owner_indices(count, value, drawn)
        self.own_unclaimed = max(0, count - sum(split(value)))
        if len(held) < drawn or held.stop == count:
            self._own_left = False
        own = self._batches[self.rank]
        return [Claimed(self.rank, i, own[i], Holder.OWNER) for i in held]

    def share_size(self, owner: int) -> tuple[int, int]:
        """`owner`'s offer in the open step: its samples and its plan's micro-batch."""
        return self._sizes[owner]

    @property
    def own_left(self) -> bool:
        """Whether this rank's offer may still have micro-batches without a holder."""
        return self._own_left

    def read_own(self) -> int:
        """Read this rank's counter (an add of 0, no ticket): how many of its offered
        micro-batches have no holder; at 0 every one has one (the owner's first front
        tickets, the helpers' valid back tickets), and its own part is over."""
        if not self._own_left:
            return 0
        count = self.share.counts[self.rank]
        self.own_unclaimed = max(
            0, count - sum(split(self._add(self._counter(self.share.step, self.rank), 0)))
        )
        if self.own_unclaimed == 0:
            self._own_left = False
        return self.own_unclaimed

    def claim_help(self, step: int, owner: int) -> Claimed | Refused:
        """Draw one back ticket on `owner`'s share: the micro-batch it names, or why not."""
        refused = check_claim(self.share, self.rank, step, owner)
        if refused is not None:
            return refused
        count = self.share.counts[owner]
        index = helper_index(count, self._add(self._counter(step, owner), BACK_TICKET))
        if isinstance(index, Refused):
            return index
        return Claimed(owner, index, self._ids(owner)[index], Holder.HELPER)

    def claim_next(self) -> Claimed | None:
        """The next micro-batch for this rank to compute under the open step's offers:
        its own next (if it offered), else one of the owner furthest behind; None when
        every offered micro-batch has its holder."""
        step = self.share.step
        if self._own_left:
            own = self.claim_own(step)
            if own:
                return own[0]
        while (owner := self._furthest_behind()) is not None:
            got = self.claim_help(step, owner)
            if isinstance(got, Claimed):
                return got
            self._exhausted.add(owner)  # the owner's front reached the helpers' back
        return None

    def keep_own(self) -> list[int]:
        """Claim every micro-batch of this rank's offer still free (a script that
        computed them all without claiming): the indices a helper holds instead."""
        if not self._own_left:
            return []
        count = self.share.counts[self.rank]
        front = self._store.add(self._counter(self.share.step, self.rank), 0) % BACK_TICKET
        held = self.claim_own(self.share.step, count - front) if front < count else []
        self._own_left = False
        kept = {c.index for c in held} | set(range(front))
        return [i for i in range(count) if i not in kept]

    def _furthest_behind(self) -> int | None:
        others = [o for o in self.share.counts if o != self.rank and o not in self._exhausted]
        for owner in [o for o in others if not self._worth_helping(o)]:
            self._exhausted.add(owner)
            others.remove(owner)
        if len(others) <= 1:  # one owner to help: its ticket says whether any is left
            return others[0] if others else None
        keys = [self._counter(self.share.step, o) for o in others]
        values = [int(v) if v else 0 for v in self._store.multi_get(keys)]
        return furthest_behind(
            self.share, self.rank, dict(zip(others, values, strict=True)), self._exhausted
        )

    def _worth_helping(self, owner: int) -> bool:
        samples, micro = self._sizes[owner]
        size = micro_samples(samples, micro, self._chunks)
        return worth_helping(self.round_trip_s, size, self._paces.get(owner, 0.0))

    def _ids(self, owner: int) -> list[list[int]]:
        """`owner`'s micro-batches. Its publish follows the same all-reduce as this
        claim: until it lands, the slot is missing (the store's get waits) or holds the
        step two before (read again)."""
        if owner not in self._batches:
            key = self._ids_key(self.share.step, owner)
            while (tagged := json.loads(self._store.get(key)))[0] != self.share.step:
                time.sleep(PUBLISH_POLL_S)
            self._batches[owner] = cut(tagged[1], self._sizes[owner][1], self._chunks)
        return self._batches[owner]
