"""The claim protocol (antdt.agent.sharing) on torch's c10d store, the one every job
already has (TCPStore behind init_process_group / torchrun). Per step and owner: its
micro-batches' ids, two ticket counters (`store.add`: the owner's from the front, the
helpers' from the back) and one record per micro-batch, claimed by compare-and-set.
A step's keys are those of the step two before it (`SLOTS`), written over when the step
is published: nothing to delete, and the store holds two steps' keys at most."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from antdt.agent.sharing import (
    Claim,
    ClaimEvent,
    Op,
    Refused,
    StepShare,
    furthest_behind,
    stolen_index,
    transition,
)

#: Key slots, reused in turn: when a rank publishes step s, every rank has passed step
#: s - 1's gradient all-reduce, so nobody reads step s - 2's keys again.
SLOTS = 2


@dataclass(frozen=True)
class Claimed:
    """A micro-batch this rank holds: whose, which, its ids and its claim record."""

    owner: int
    index: int
    ids: list[int]
    claim: Claim


class StoreClaims:
    """One rank's client of the claim store; the training thread's only, one step at a
    time (`publish` opens it). `store`: a c10d Store (TCPStore, PrefixStore, ...)."""

    def __init__(
        self,
        store: Any,
        rank: int,
        world: int,
        clock: Callable[[], float] = time.monotonic,
        prefix: str = "antdt/share",
    ) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is outside a job of {world} ranks")
        self._store, self.rank, self.world = store, rank, world
        self._clock, self._prefix = clock, prefix
        self._step = -1
        self._own: list[list[int]] = []
        self._batches: dict[int, list[list[int]]] = {}
        self._own_done = True
        self._exhausted: set[int] = set()

    def _key(self, step: int, *parts: object) -> str:
        return "/".join((self._prefix, str(step % SLOTS), *map(str, parts)))

    @property
    def share(self) -> StepShare:
        counts = {o: len(b) for o, b in self._batches.items()}
        return StepShare(self._step, self.world, counts)

    def publish(self, step: int, own: list[list[int]]) -> None:
        """Open `step` with this rank's micro-batches, their records UNCLAIMED, in one
        round trip. Every rank must publish before the step's count all-reduce, which
        every claim comes after."""
        keys = [self._key(step, k, self.rank) for k in ("ids", "front", "back")]
        keys += [self._key(step, "mb", self.rank, index) for index in range(len(own))]
        self._store.multi_set(keys, [json.dumps(own), "0", "0", *([""] * len(own))])
        self._step, self._own, self._batches = step, own, {self.rank: own}
        self._own_done = not own
        self._exhausted = set()

    def claim_next(self) -> Claimed | None:
        """The next micro-batch for this rank to compute: its own next, else one from the rank
        furthest behind; None when every micro-batch of the step is claimed."""
        while not self._own_done:
            index = self._store.add(self._key(self._step, "front", self.rank), 1) - 1
            got = self.claim(self._step, self.rank, index) if index < len(self._own) else None
            if isinstance(got, Claimed):
                return got
            self._own_done = True  # past the end, or a helper has it: so the rest too
        return self._steal()

    def keep_own(self) -> list[Claimed]:
        """Claim what is left of this rank's own micro-batches (a script that computed
        them all without claiming); the ones a helper holds are returned."""
        taken: list[Claimed] = []
        while not self._own_done:
            index = self._store.add(self._key(self._step, "front", self.rank), 1) - 1
            if index >= len(self._own):
                break
            got = self.claim(self._step, self.rank, index)
            if isinstance(got, Claimed):
                self.done(got)
            else:
                held = Claim.decode(self._record_text(self.rank, index))
                taken.append(Claimed(self.rank, index, self._own[index], held))
        self._own_done = True
        return taken

    def _steal(self) -> Claimed | None:
        self._load_batches()
        while True:
            owner = furthest_behind(self.share, self.rank, self._taken(), self._exhausted)
            if owner is None:
                return None
            ticket = self._store.add(self._key(self._step, "back", owner), 1) - 1
            index = stolen_index(len(self._batches[owner]), ticket)
            got = self.claim(self._step, owner, index) if index >= 0 else None
            if isinstance(got, Claimed):
                return got
            self._exhausted.add(owner)  # the owner's own claims reached the helpers'

    def _taken(self) -> list[int]:
        keys = [self._key(self._step, k, o) for o in range(self.world) for k in ("front", "back")]
        values = [int(v) for v in self._store.multi_get(keys)]
        return [values[2 * o] + values[2 * o + 1] for o in range(self.world)]

    def _load_batches(self) -> None:
        missing = [o for o in range(self.world) if o not in self._batches]
        if missing:
            values = self._store.multi_get([self._key(self._step, "ids", o) for o in missing])
            for owner, text in zip(missing, values, strict=True):
                self._batches[owner] = json.loads(text)

    def claim(self, step: int, owner: int, index: int) -> Claimed | Refused:
        """Claim micro-batch `index` of `owner` in `step`: one compare-and-set."""
        if step == self._step and 0 <= owner < self.world and owner not in self._batches:
            self._load_batches()
        event = ClaimEvent(Op.CLAIM, self.rank, step, owner, index)
        wanted = transition(self.share, Claim(), event, self._clock())
        if isinstance(wanted, Refused):
            return wanted
        text = wanted.encode()
        found = self._store.compare_set(self._key(step, "mb", owner, index), "", text)
        if found.decode() != text:  # another rank's claim is there
            refused = transition(self.share, Claim.decode(found.decode()), event, self._clock())
            assert isinstance(refused, Refused)
            return refused
        return Claimed(owner, index, self._batches[owner][index], wanted)

    def done(self, held: Claimed) -> Claim | Refused:
        """Mark a computed micro-batch DONE: one compare-and-set from its claim."""
        event = ClaimEvent(Op.DONE, self.rank, self._step, held.owner, held.index)
        wanted = transition(self.share, held.claim, event, self._clock())
        if isinstance(wanted, Refused):
            return wanted
        key = self._key(self._step, "mb", held.owner, held.index)
        found = self._store.compare_set(key, held.claim.encode(), wanted.encode()).decode()
        if found != wanted.encode():
            refused = transition(self.share, Claim.decode(found), event, self._clock())
            assert isinstance(refused, Refused)
            return refused
        return wanted

    def record(self, owner: int, index: int) -> Claim:
        """The store's record of a micro-batch of the open step (tests, audits)."""
        return Claim.decode(self._record_text(owner, index))

    def _record_text(self, owner: int, index: int) -> str:
        key = self._key(self._step, "mb", owner, index)
        return self._store.get(key).decode() if self._store.check([key]) else ""
