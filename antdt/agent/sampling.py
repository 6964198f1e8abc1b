"""Sample order inside a shard, and consumption of granted shards. Pure (no I/O, no clock).

The order depends only on (seed, epoch, shard), never on the rank or the grant attempt:
a shard re-granted to another rank after a failure resumes at its recorded position in
the same order, which is what makes "exactly once" hold across re-grants."""

from __future__ import annotations

import hashlib
import random
from collections import deque
from dataclasses import dataclass, field

from antdt.schemas import ShardGrant, ShardRef


def shard_order(seed: int, epoch: int, shard: int, start: int, end: int) -> list[int]:
    """A deterministic permutation of the sample ids [start, end).

    Seeded through a hash so that neighbouring (seed, epoch, shard) triples give unrelated
    orders; random.Random with an int seed is stable across platforms and versions."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{shard}".encode(), digest_size=8).digest()
    ids = list(range(start, end))
    random.Random(int.from_bytes(digest, "big")).shuffle(ids)
    return ids


@dataclass
class Cursor:
    """A granted shard being consumed: its order, and how far into it this rank is."""

    grant: ShardGrant
    order: list[int]
    position: int

    @classmethod
    def open(cls, grant: ShardGrant, seed: int) -> Cursor:
        order = shard_order(seed, grant.epoch, grant.shard, grant.start, grant.end)
        return cls(grant=grant, order=order, position=grant.position)

    @property
    def remaining(self) -> int:
        return len(self.order) - self.position

    def take(self, n: int) -> list[int]:
        ids = self.order[self.position : self.position + n]
        self.position += len(ids)
        return ids


@dataclass
class Segment:
    """Ids taken in a row from one grant; `finishes`: the grant's last id is among them."""

    grant: ShardGrant
    ids: list[int]
    finishes: bool


@dataclass
class Taken:
    """What one take handed out: the ids, and the shards whose last sample is among them
    (`segments`, when not None, also gets the ids grant by grant)."""

    ids: list[int] = field(default_factory=list)
    finished: list[ShardRef] = field(default_factory=list)
    rechecked: bool = False  # asked the service again before calling the epoch over
    segments: list[Segment] | None = None


@dataclass
class LocalShards:
    """The grants a rank holds, consumed in grant order; a batch may span several."""

    seed: int
    cursors: deque[Cursor] = field(default_factory=deque)
    remaining: int = 0

    def add(self, grant: ShardGrant) -> bool:
        return self.add_cursor(Cursor.open(grant, self.seed))

    def add_cursor(self, cursor: Cursor) -> bool:
        """Hold a new grant; False when the shard is already held (a duplicate reply).
        The caller handles a grant with nothing left (position == size) itself."""
        grant = cursor.grant
        if any(c.grant.epoch == grant.epoch and c.grant.shard == grant.shard for c in self.cursors):
            return False
        self.cursors.append(cursor)
        self.remaining += cursor.remaining
        return True

    def take(self, n: int, max_epoch: int, into: Taken) -> int:
        """Move up to n ids from grants of epochs <= max_epoch into `into`; returns how many."""
        moved = 0
        while moved < n and self.cursors and self.cursors[0].grant.epoch <= max_epoch:
            head = self.cursors[0]
            ids = head.take(n - moved)
            into.ids.extend(ids)
            moved += len(ids)
            if into.segments is not None and ids:
                into.segments.append(Segment(head.grant, ids, head.remaining == 0))
            if head.remaining == 0:
                into.finished.append(head.grant.ref())
                self.cursors.popleft()
        self.remaining -= moved
        return moved

    def available(self, max_epoch: int) -> int:
        return sum(c.remaining for c in self.cursors if c.grant.epoch <= max_epoch)

    def drop_before(self, epoch: int) -> list[ShardRef]:
        """Forget grants of epochs before `epoch` (the ledger moved on); returns them."""
        dropped = [c.grant.ref() for c in self.cursors if c.grant.epoch < epoch]
        kept = [c for c in self.cursors if c.grant.epoch >= epoch]
        self.cursors = deque(kept)
        self.remaining = sum(c.remaining for c in kept)
        return dropped

    def __len__(self) -> int:
        return len(self.cursors)
