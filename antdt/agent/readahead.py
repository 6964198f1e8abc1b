"""Sample ids a DataLoader took ahead of the model: taken from the shard stream, not yet
trained on. Pure. The ledger must not count them (commit positions subtract them), and a
rewind hands them out again first, in the same order, so none is lost or repeated."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from antdt.agent.sampling import Segment
from antdt.schemas import ShardGrant, ShardRef

ShardKey = tuple[int, int, int]  # epoch, shard, attempt


def shard_key(grant: ShardGrant | ShardRef) -> ShardKey:
    return grant.epoch, grant.shard, grant.attempt


@dataclass
class Lot:
    """One batch's ids, sampled for `step` under a plan giving this rank `want` ids."""

    step: int
    want: int
    segments: list[Segment]

    @property
    def ids(self) -> list[int]:
        return [i for segment in self.segments for i in segment.ids]

    @property
    def finished(self) -> list[ShardRef]:
        return [s.grant.ref() for s in self.segments if s.finishes]


@dataclass
class ReadAhead:
    """Lifecycle of a lot: sampled (in `lots`) -> delivered (`open`) -> reached the model
    (gone), or back to `returned` by a rewind from either state."""

    returned: deque[Segment] = field(default_factory=deque)
    lots: deque[Lot] = field(default_factory=deque)
    open: Lot | None = None

    def take_returned(self, n: int) -> list[Segment]:
        """Up to n ids from the front of what a rewind handed back, as segments."""
        out: list[Segment] = []
        while n > 0 and self.returned:
            head = self.returned[0]
            if len(head.ids) <= n:
                out.append(self.returned.popleft())
                n -= len(head.ids)
            else:
                out.append(Segment(head.grant, head.ids[:n], False))
                self.returned[0] = Segment(head.grant, head.ids[n:], head.finishes)
                n = 0
        return out

    def waiting(self) -> bool:
        """Ids taken and not delivered to a step: sampled lots, or handed back by a rewind."""
        return bool(self.returned or self.lots)

    def add(self, lot: Lot) -> None:
        self.lots.append(lot)

    def head(self) -> Lot | None:
        return self.lots[0] if self.lots else None

    def deliver(self) -> Lot:
        """The oldest sampled lot reached the training loop."""
        self.open = self.lots.popleft()
        return self.open

    def reached(self, lot: Lot) -> None:
        if lot is self.open:
            self.open = None

    def rewind(self) -> None:
        """Everything not yet trained on goes back to the front, oldest first."""
        older = ([self.open] if self.open else []) + list(self.lots)
        segments = [s for lot in older for s in lot.segments]
        self.returned = deque(segments + list(self.returned))
        self.lots.clear()
        self.open = None

    def behind(self) -> dict[ShardKey, tuple[ShardGrant, int]]:
        """Per grant: how many of its taken ids the model has not reached."""
        out: dict[ShardKey, tuple[ShardGrant, int]] = {}
        pending = [*self.returned, *(s for lot in self._all() for s in lot.segments)]
        for segment in pending:
            key = shard_key(segment.grant)
            count = out[key][1] if key in out else 0
            out[key] = (segment.grant, count + len(segment.ids))
        return out

    def _all(self) -> list[Lot]:
        return ([self.open] if self.open else []) + list(self.lots)

    def __len__(self) -> int:
        return len(self.returned) + len(self.lots) + (self.open is not None)
