"""The bounded event queue drops and counts instead of growing (pure)."""

from __future__ import annotations

import pytest

from antdt.agent.outbox import BoundedQueue


def test_full_queue_drops_and_counts() -> None:
    queue: BoundedQueue[int] = BoundedQueue(3)
    assert [queue.put(i) for i in range(5)] == [True, True, True, False, False]
    assert queue.dropped == 2 and len(queue) == 3
    assert queue.pop_all() == [0, 1, 2]
    assert queue.put(9) and queue.pop_all() == [9]
    queue.drop(4)  # the consumer could not publish (bus down)
    assert (queue.dropped_full, queue.dropped_later, queue.dropped) == (2, 4, 6)


def test_maxlen_must_be_positive() -> None:
    with pytest.raises(ValueError):
        BoundedQueue(0)
