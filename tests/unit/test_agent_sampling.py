"""In-shard sample order and the consumption of grants (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from antdt.agent.sampling import LocalShards, Taken, shard_order
from antdt.schemas import ShardGrant, ShardRef


def grant(shard: int, start: int, end: int, position: int = 0, epoch: int = 0) -> ShardGrant:
    return ShardGrant(epoch=epoch, shard=shard, attempt=0, start=start, end=end, position=position)


@given(
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 100),
    shard=st.integers(0, 10_000),
    start=st.integers(0, 10**6),
    size=st.integers(1, 300),
)
def test_order_is_a_deterministic_permutation(
    seed: int, epoch: int, shard: int, start: int, size: int
) -> None:
    order = shard_order(seed, epoch, shard, start, start + size)
    assert sorted(order) == list(range(start, start + size))
    assert order == shard_order(seed, epoch, shard, start, start + size)


def test_order_depends_on_seed_epoch_and_shard() -> None:
    base = shard_order(0, 0, 0, 0, 64)
    assert base != list(range(64))
    assert shard_order(1, 0, 0, 0, 64) != base
    assert shard_order(0, 1, 0, 0, 64) != base
    assert shard_order(0, 0, 1, 0, 64) != base


def numbers(text: str) -> list[int]:
    return [int(word) for word in text.split()]


#: The sample order in a few shards, (seed, epoch, shard, start, end) -> ids: literal,
#: so that a change to the order fails here. A rank resumed at a position by a newer
#: version must read the samples after it, exactly once.
GOLDEN_SAMPLE_ORDERS = [
    ((0, 0, 0, 0, 16), numbers("9 8 11 10 12 3 0 4 1 14 6 7 15 5 13 2")),
    ((7, 2, 3, 100, 110), numbers("104 107 103 109 101 100 105 106 102 108")),
    (
        (42, 5, 17, 1000, 1020),
        numbers(
            "1005 1000 1003 1011 1014 1004 1015 1017 1010 1002 1001 1009 1007 1012 1013 1008"
            " 1016 1019 1006 1018"
        ),
    ),
    (
        (2**31, 100, 9999, 10**6, 10**6 + 12),
        numbers(
            "1000007 1000004 1000011 1000005 1000010 1000006 1000008 1000009 1000003 1000002"
            " 1000001 1000000"
        ),
    ),
]


@pytest.mark.parametrize(("key", "ids"), GOLDEN_SAMPLE_ORDERS)
def test_sample_order_is_pinned_to_golden_values(
    key: tuple[int, int, int, int, int], ids: list[int]
) -> None:
    assert shard_order(*key) == ids


def test_batches_span_shards_and_report_finished_ones() -> None:
    local = LocalShards(seed=3)
    assert local.add(grant(0, 0, 5))
    assert local.add(grant(1, 5, 10))
    assert not local.add(grant(1, 5, 10))  # duplicate reply
    first, second = Taken(), Taken()
    assert local.take(3, 0, first) == 3 and first.finished == []
    assert local.take(4, 0, second) == 4
    assert second.finished == [ShardRef(epoch=0, shard=0, attempt=0)]
    assert set(first.ids + second.ids) <= set(range(10)) and len(set(first.ids + second.ids)) == 7
    assert first.ids + second.ids[:2] == shard_order(3, 0, 0, 0, 5)
    assert local.remaining == 3 and len(local) == 1


def test_resume_from_position_continues_the_same_order() -> None:
    local = LocalShards(seed=1)
    local.add(grant(4, 40, 50, position=6))
    taken = Taken()
    local.take(100, 0, taken)
    assert taken.ids == shard_order(1, 0, 4, 40, 50)[6:]
    assert taken.finished == [ShardRef(epoch=0, shard=4, attempt=0)]


def test_take_stops_at_grants_of_a_later_epoch_and_drop_before() -> None:
    local = LocalShards(seed=0)
    local.add(grant(0, 0, 2, epoch=0))
    local.add(grant(0, 0, 2, epoch=1))
    taken = Taken()
    assert local.take(10, 0, taken) == 2
    assert local.available(0) == 0 and local.available(1) == 2
    local.add(grant(5, 10, 12, epoch=0))
    assert local.drop_before(1) == [ShardRef(epoch=0, shard=5, attempt=0)]
    assert local.remaining == 2
