"""What the training thread hands to the agent's loop: step records (bounded, dropped
with a counter when full) and sample-log lines (never dropped: they are the accounting)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class StepRecord:
    """Raw timings of one finished step; the loop turns it into a StepEvent, so the
    training thread pays for no validation or encoding."""

    step: int
    epoch: int
    plan_version: int
    local_batch: int
    samples: int
    data_wait_s: float
    comm_s: float
    step_s: float
    started_at: float
    helped: tuple[tuple[int, int], ...] = ()  # (owner, samples) of others' shares computed
    one_piece_s: float | None = None  # under work sharing: its share in one pass (s)


@dataclass(frozen=True)
class SampleLine:
    epoch: int
    step: int
    ids: list[int]


@dataclass(frozen=True)
class RestoreMark:
    """In the sample log: this process restored the ledger to `step` (None: the start);
    lines of earlier incarnations after `step` were undone."""

    step: int | None


class BoundedQueue(Generic[T]):
    """A single-producer single-consumer queue that drops (and counts) when full.

    deque.append / popleft are atomic under the GIL; the two counters are each written
    by one thread only, so no lock is needed on the training thread's path."""

    def __init__(self, maxlen: int) -> None:
        if maxlen < 1:
            raise ValueError("maxlen must be >= 1")
        self.maxlen = maxlen
        self._items: deque[T] = deque()
        self.dropped_full = 0  # written by the producer
        self.dropped_later = 0  # written by the consumer (bus down, publish failed)

    def put(self, item: T) -> bool:
        if len(self._items) >= self.maxlen:
            self.dropped_full += 1
            return False
        self._items.append(item)
        return True

    def pop_all(self) -> list[T]:
        out: list[T] = []
        while self._items:
            out.append(self._items.popleft())
        return out

    def drop(self, n: int) -> None:
        self.dropped_later += n

    @property
    def dropped(self) -> int:
        return self.dropped_full + self.dropped_later

    def __len__(self) -> int:
        return len(self._items)
