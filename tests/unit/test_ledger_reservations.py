"""Reservations and early answers in the pure fetch path (ledger.py, early.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from antdt.schemas import FetchStatus, JobSpec, ShardFetch, ShardRef, ShardReply
from antdt.services.shards.early import Stored, early_reply
from antdt.services.shards.ledger import (
    MAX_RESERVED,
    LedgerState,
    Work,
    _lacking,
    new_ledger,
    plan_fetch,
    reservation_target,
)


def ledger(world: int = 2, shards: int = 400) -> LedgerState:
    spec = JobSpec(
        job="job", world_size=world, dataset_size=shards * 10, shard_size=10, global_batch=world
    )
    return new_ledger(spec)


def fetch(rank: int = 0, want: int = 1, done: tuple = (), held: tuple | None = ()) -> ShardFetch:
    return ShardFetch(job="job", rank=rank, epoch=0, done=done, want=want, held=held)


def mine(state: LedgerState, rank: int = 0) -> list[int]:
    return [e.shard for e in state.in_flight if e.rank == rank]


def test_a_rank_saying_what_it_holds_gets_a_reservation_it_is_not_told_of() -> None:
    result = plan_fetch(ledger(), fetch(want=2), reserve=8)
    assert isinstance(result.reply, ShardReply) and len(result.reply.grants) == 2
    assert result.reserved == 8 and len(mine(result.state)) == 10
    assert result.early is None  # new grants: the reply waits for the write


def test_reserved_shards_are_handed_out_in_order_and_topped_up_below_half() -> None:
    first = plan_fetch(ledger(), fetch(want=1), reserve=8)
    held = tuple(g.ref() for g in first.reply.grants)  # type: ignore[union-attr]
    order = mine(first.state)
    state = first.state
    for step in range(1, 5):  # hand out 4 of the 8 reserved: no top-up yet
        result = plan_fetch(state, fetch(done=held), reserve=8)
        reply = result.reply
        assert isinstance(reply, ShardReply) and reply.grants[0].shard == order[step]
        assert result.early is not None and result.early.deliveries[0][0] == order[step]
        assert result.reserved == 0
        held, state = tuple(g.ref() for g in reply.grants), result.state
    result = plan_fetch(state, fetch(done=held), reserve=8)
    assert result.reserved == 5  # 3 left after this one: below half, back up to 8


def test_a_reply_lost_in_flight_is_delivered_again() -> None:
    first = plan_fetch(ledger(), fetch(want=1), reserve=0)
    again = plan_fetch(first.state, fetch(want=1), reserve=0)  # the rank never saw it
    assert again.reply.grants == first.reply.grants  # type: ignore[union-attr]
    assert again.state.cursor == first.state.cursor


def test_early_answers_need_the_delivery_stored_and_list_dones_not_yet_written() -> None:
    first = plan_fetch(ledger(), fetch(want=1), reserve=4)
    stored = Stored(first.state)  # the grant and its reservation are written
    held = tuple(g.ref() for g in first.reply.grants)  # type: ignore[union-attr]
    second = plan_fetch(first.state, fetch(done=held), reserve=4)
    assert second.early is not None and isinstance(second.reply, ShardReply)
    early = early_reply(second.reply, second.early, stored)
    assert early is not None and early.unconfirmed == held
    written = Stored(second.state)
    assert early_reply(second.reply, second.early, written).unconfirmed == ()  # type: ignore[union-attr]
    not_yet = Stored(ledger())  # nothing written: the reserved shard is not durable
    assert early_reply(second.reply, second.early, not_yet) is None


def test_reservations_thin_out_towards_the_end_and_are_bounded_per_job() -> None:
    work = Work.of(ledger(world=2, shards=400))
    assert reservation_target(work, 16, 1 / 2) == 16
    assert reservation_target(Work.of(ledger(world=2, shards=40)), 16, 1 / 2) == 5  # 40 // 8
    many = Work.of(ledger(world=64, shards=10**5))
    assert reservation_target(many, 16, 1 / 64) == MAX_RESERVED // 64
    assert reservation_target(Work.of(ledger(world=1000, shards=10**5)), 16, 1 / 1000) == 0
    assert reservation_target(work, 0, 1 / 2) == 0


def test_a_rank_with_a_small_share_of_the_batch_reserves_in_proportion() -> None:
    """lb-bsp gave the straggler 33 of 1024 samples per step: an even share reserved for
    it would last it longer than the epoch, and everyone would wait for it at the end."""
    work = Work.of(ledger(world=4, shards=187))
    assert reservation_target(work, 16, 331 / 1024) == 15  # 187 * 0.32 / 4
    assert reservation_target(work, 16, 33 / 1024) == 1
    assert reservation_target(work, 16, 1 / 4) == 11  # no batches said: an even share


def test_epoch_done_only_when_nothing_is_left_for_the_rank() -> None:
    state = ledger(world=1, shards=3)
    result = plan_fetch(state, fetch(want=1), reserve=8)
    assert result.reply.status == FetchStatus.OK  # type: ignore[union-attr]
    held: tuple = tuple(g.ref() for g in result.reply.grants)  # type: ignore[union-attr]
    statuses = []
    for _ in range(4):
        result = plan_fetch(result.state, fetch(done=held), reserve=8)
        reply = result.reply
        assert isinstance(reply, ShardReply)
        statuses.append(reply.status)
        held = tuple(g.ref() for g in reply.grants)
    assert statuses[:2] == [FetchStatus.OK, FetchStatus.OK]
    assert FetchStatus.EPOCH_DONE in statuses[2:] or result.state.complete


def test_without_held_every_grant_is_re_sent_and_nothing_reserved() -> None:
    first = plan_fetch(ledger(), fetch(want=2, held=None), reserve=8)
    again = plan_fetch(first.state, fetch(want=0, held=None), reserve=8)
    assert first.reserved == 0 and again.early is None
    assert len(again.reply.grants) == 2  # type: ignore[union-attr]


@given(
    reserve=st.integers(0, 24),
    keep=st.lists(st.booleans(), max_size=40),
    want=st.integers(0, 8),
    foreign=st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_what_a_rank_lacks_is_counted_without_listing_its_reservation(
    reserve: int, keep: list[bool], want: int, foreign: bool
) -> None:
    """_lacking stops at the first `want` shards the rank lacks; its count and its picks
    must equal listing every entry of the rank, as the fetch path did before."""
    state = plan_fetch(ledger(world=2, shards=400), fetch(want=1), reserve=reserve).state
    state = plan_fetch(state, fetch(rank=1, want=2), reserve=reserve).state  # another rank's
    work = Work.of(state)
    entries = [e for e in state.in_flight if e.rank == 0]
    known = {(e.shard, e.attempt) for e, kept in zip(entries, keep, strict=False) if kept}
    if foreign:  # a ref the rank does not hold as it says: not counted as held
        other = next(e for e in state.in_flight if e.rank == 1)
        known |= {(other.shard, other.attempt), (entries[0].shard, entries[0].attempt + 1)}
    naive = [e for e in entries if (e.shard, e.attempt) not in known]
    held = tuple(ShardRef(epoch=state.epoch, shard=s, attempt=a) for s, a in sorted(known))
    assert _lacking(work, 0, held, want) == (len(naive), naive[:want])
