"""The shard stream's state machine: requests, replies, epochs (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError, create_model

from antdt.agent.sampling import Cursor, Taken
from antdt.agent.stream_state import MIN_RETRY_S, Settled, StreamState, open_cursors
from antdt.agent.unconfirmed import RECONFIRM_AFTER_S, Unconfirmed
from antdt.runtime.bus import Rejected
from antdt.runtime.bus.messages import Decoder, encode
from antdt.schemas import FetchStatus, ShardFetch, ShardGrant, ShardRef, ShardReply
from antdt.schemas.base import WireModel


def state(**kw: int) -> StreamState:
    return StreamState(
        job="j",
        rank=0,
        seed=0,
        prefetch=kw.get("prefetch", 2),
        shard_size=kw.get("shard_size", 4),
        global_batch=kw.get("global_batch", 0),
    )


def g(shard: int, epoch: int = 0, size: int = 4, position: int = 0) -> ShardGrant:
    return ShardGrant(
        epoch=epoch,
        shard=shard,
        attempt=0,
        start=shard * size,
        end=(shard + 1) * size,
        position=position,
    )


def reply(
    status: FetchStatus, epoch: int = 0, *grants: ShardGrant, retry: float = 0.0
) -> ShardReply:
    return ShardReply(job="j", epoch=epoch, status=status, grants=grants, retry_after_s=retry)


def answer(s: StreamState, r: ShardReply) -> float:
    fetch = s.next_fetch()
    assert fetch is not None
    return answer_to(s, fetch, r)


def answer_to(s: StreamState, fetch: ShardFetch, r: ShardReply) -> float:
    cursors: list[Cursor] = open_cursors(r.grants, s.seed)
    return s.on_reply(fetch, r, cursors)


def test_first_request_asks_epoch_zero_for_prefetch_grants() -> None:
    s = state(prefetch=3)
    fetch = s.next_fetch()
    assert fetch is not None and (fetch.epoch, fetch.want, fetch.done) == (0, 3, ())


def test_ok_establishes_epoch_and_keeps_prefetch_grants_ahead() -> None:
    s = state()
    assert answer(s, reply(FetchStatus.OK, 0, g(0), g(1))) == 0.0
    assert s.ready(0) and s.next_fetch() is None  # two grants held: nothing to ask
    taken = Taken()
    assert s.take(5, 0, taken) and len(taken.ids) == 5
    assert taken.finished == [ShardRef(epoch=0, shard=0, attempt=0)]
    fetch = s.next_fetch()
    assert fetch is not None and fetch.want == 1 and fetch.done == ()


def test_the_next_grant_is_asked_for_with_the_done_of_the_shard_it_replaces() -> None:
    # Shards of 8, batches of 2: the shard finished by a take is reported once its step
    # is synced, in the request that asks for the next grant (one request per shard).
    s = state(prefetch=2, shard_size=8)
    answer(s, reply(FetchStatus.OK, 0, g(0, size=8), g(1, size=8)))
    taken = Taken()
    for _ in range(4):
        taken = Taken()
        assert s.take(2, 0, taken)
        assert s.next_fetch() is None  # nothing finished yet, or not yet synced
        s.synced(taken.finished)
    assert taken.finished == [ShardRef(epoch=0, shard=0, attempt=0)]
    fetch = s.next_fetch()
    assert fetch is not None and fetch.want == 1
    assert fetch.done == (ShardRef(epoch=0, shard=0, attempt=0),)


def test_the_next_grant_is_asked_for_at_once_when_what_is_held_runs_short() -> None:
    # Shards of 8, batches of 5: after the take that finished shard 0, the 3 samples
    # left last less than two takes: ask now, report the done after the sync.
    s = state(prefetch=2, shard_size=8)
    answer(s, reply(FetchStatus.OK, 0, g(0, size=8), g(1, size=8)))
    for _ in range(2):
        s.take(5, 0, Taken())
    fetch = s.next_fetch()
    assert fetch is not None and (fetch.want, fetch.done) == (1, ())


def test_a_big_batch_asks_for_enough_shards() -> None:
    s = state(prefetch=2, shard_size=4)
    answer(s, reply(FetchStatus.OK, 0, g(0), g(1)))
    taken = Taken()
    assert not s.take(20, 0, taken)  # 8 held, 12 short: must wait
    assert s.demand == 12
    fetch = s.next_fetch()
    assert fetch is not None and fetch.want == 8  # ceil((12 + 20) / 4) capped at 8


def test_done_refs_only_after_sync_and_resent_after_failure() -> None:
    s = state()
    answer(s, reply(FetchStatus.OK, 0, g(0), g(1)))
    taken = Taken()
    s.take(4, 0, taken)
    fetch = s.next_fetch()
    assert fetch is not None and fetch.done == ()  # consumed, not yet synced
    s.on_failure()
    s.synced(taken.finished)
    fetch = s.next_fetch()
    assert fetch is not None and fetch.done == (ShardRef(epoch=0, shard=0, attempt=0),)
    s.on_failure()
    assert s.unreported() == 1
    fetch = s.next_fetch()
    assert fetch is not None and len(fetch.done) == 1
    s.on_reply(fetch, reply(FetchStatus.OK, 0, g(2)), open_cursors((g(2),), 0))
    assert s.unreported() == 0


def finish(s: StreamState, shard: int) -> ShardRef:
    """Take the whole of grant `shard` (size 4) and sync it: its ref is pending done."""
    taken = Taken()
    s.take(4, 0, taken)
    s.synced(taken.finished)
    assert taken.finished == [ShardRef(epoch=0, shard=shard, attempt=0)]
    return taken.finished[0]


def listing(r: ShardReply, *unconfirmed: ShardRef) -> ShardReply:
    return r.model_copy(update={"unconfirmed": unconfirmed})


def test_an_unconfirmed_done_ref_goes_out_again_only_once_it_is_due() -> None:
    """The service accepted it but had not written it: it is reported again after
    RECONFIRM_AFTER_S, not with every request, and forgotten once a reply stops listing it."""
    s = state(prefetch=1)
    fetch = s.next_fetch(now=0.0)
    assert fetch is not None
    answer_to(s, fetch, reply(FetchStatus.OK, 0, g(0)))
    first = finish(s, 0)
    fetch = s.next_fetch(now=1.0)
    assert fetch is not None and fetch.done == (first,)
    answer_to(s, fetch, listing(reply(FetchStatus.OK, 0, g(1)), first))
    assert s.unreported() == 1 and s.unacknowledged() == (first,)
    second = finish(s, 1)
    early = 1.0 + RECONFIRM_AFTER_S / 2
    fetch = s.next_fetch(now=early)
    assert fetch is not None and fetch.done == (second,)  # the first is not due yet
    answer_to(s, fetch, listing(reply(FetchStatus.OK, 0, g(2)), second))
    finish(s, 2)
    due = 1.0 + RECONFIRM_AFTER_S
    fetch = s.next_fetch(now=due)
    assert fetch is not None and set(fetch.done) == {first, ShardRef(epoch=0, shard=2, attempt=0)}
    s.on_failure()  # lost: everything it carried goes with the next request
    fetch = s.next_fetch(now=due)
    assert fetch is not None and first in fetch.done
    answer_to(s, fetch, reply(FetchStatus.OK, 0, g(3)))  # durable: neither is listed
    assert s.unacknowledged() == (second,)  # sent at `early`: still waiting for its turn
    confirm = s.next_fetch(confirm=True, now=early)  # the idle fetcher asks for them all
    assert confirm is not None and confirm.done == (second,)


def test_without_a_clock_every_unconfirmed_ref_goes_out_again() -> None:
    s = state(prefetch=1)
    answer(s, reply(FetchStatus.OK, 0, g(0)))
    first = finish(s, 0)
    fetch = s.next_fetch()
    assert fetch is not None
    answer_to(s, fetch, listing(reply(FetchStatus.OK, 0, g(1)), first))
    second = finish(s, 1)
    fetch = s.next_fetch()
    assert fetch is not None and fetch.done == (first, second)


def test_epoch_done_ends_the_epoch_once_local_grants_are_used() -> None:
    s = state()
    answer(s, reply(FetchStatus.EPOCH_DONE, 0, g(7)))
    assert s.exhausted and not s.epoch_over(0)
    taken = Taken()
    # Out of data: the rank asks once more (a removed rank's shards may have come back).
    assert not s.take(10, 0, taken) and taken.rechecked
    fetch = s.next_fetch()
    assert fetch is not None and fetch.want >= 1
    answer_to(s, fetch, reply(FetchStatus.EPOCH_DONE, 0))
    assert s.take(10, 0, taken)  # complete although short: no more data this epoch
    assert len(taken.ids) == 4 and s.epoch_over(0)
    assert s.next_fetch() is None


def test_an_exhausted_rank_takes_shards_requeued_since() -> None:
    s = state()
    answer(s, reply(FetchStatus.EPOCH_DONE, 0))
    taken = Taken()
    assert not s.take(6, 0, taken)
    answer(s, reply(FetchStatus.OK, 0, g(3)))  # a removed rank's shard, granted again
    assert s.take(4, 0, taken) and len(taken.ids) == 4


def test_next_epoch_pending_then_ok() -> None:
    s = state()
    answer(s, reply(FetchStatus.EPOCH_DONE, 0))
    s.advance(0)
    assert not s.ready(1)
    fetch = s.next_fetch()
    assert fetch is not None and (fetch.epoch, fetch.want) == (1, 2)
    assert s.on_reply(fetch, reply(FetchStatus.PENDING, 0, retry=0.3), []) == 0.3
    assert not s.ready(1)
    assert answer(s, reply(FetchStatus.EPOCH_DONE, 0)) == MIN_RETRY_S  # old epoch: retry
    assert not s.ready(1)
    answer(s, reply(FetchStatus.OK, 1, g(0, epoch=1)))
    assert s.ready(1) and s.epoch == 1


def test_jump_to_a_later_epoch_drops_older_grants() -> None:
    s = state()
    answer(s, reply(FetchStatus.OK, 0, g(0)))
    answer(s, reply(FetchStatus.OK, 3, g(1, epoch=3)))
    assert s.epoch == 3 and s.ready(0) and s.dropped_grants == 1
    assert s.epoch_over(0)  # the training loop's epoch 0 ends; epochs() yields 3 next
    taken = Taken()
    assert s.take(2, 3, taken) and len(taken.ids) == 2


def test_job_done_stops_everything() -> None:
    s = state()
    answer(s, reply(FetchStatus.JOB_DONE, 4))
    assert s.job_done and s.ready(99) and s.epoch_over(0) and s.next_fetch() is None


def test_empty_ok_does_not_spin_and_restored_end_of_shard_is_reported() -> None:
    s = state()
    assert answer(s, reply(FetchStatus.OK, 0)) == MIN_RETRY_S
    answer(s, reply(FetchStatus.OK, 0, g(2, position=4)))
    assert s.pending_done == [ShardRef(epoch=0, shard=2, attempt=0)]
    assert len(s.local) == 0


def test_a_replayed_grant_is_never_served_twice() -> None:
    s = state()
    answer(s, reply(FetchStatus.OK, 0, g(0), g(1)))
    taken = Taken()
    s.take(4, 0, taken)  # shard 0 used up
    assert answer(s, reply(FetchStatus.OK, 0, g(0), g(1))) == MIN_RETRY_S  # nothing new
    assert s.dropped_grants == 2 and s.local.remaining == 4
    again = g(0).model_copy(update={"attempt": 1, "position": 2})  # a real re-grant
    answer(s, reply(FetchStatus.OK, 0, again))
    assert s.local.remaining == 6


def test_grants_of_a_lost_reply_sent_again_are_taken_and_the_held_ones_ignored() -> None:
    """A reply lost on the way (NATS restarting, a request timing out while the service
    commits) carried grants the rank never saw. A service that sends a rank's in-flight
    grants again with every answer (the real one does not yet: see the xfail test in
    tests/integration/test_agent_shards.py) lets the rank recover them: the lost grant is
    taken, the held ones are not served twice, also when the answer is EPOCH_DONE."""
    s = state()
    answer(s, reply(FetchStatus.OK, 0, g(0), g(1)))
    taken = Taken()
    s.take(4, 0, taken)  # shard 0 used up: ask for one more
    fetch = s.next_fetch()
    assert fetch is not None and fetch.want == 1
    s.on_failure()  # the service granted shard 2; its reply never came
    assert answer(s, reply(FetchStatus.OK, 0, g(0), g(1), g(2), g(3))) == 0.0
    assert s.dropped_grants == 2 and s.local.remaining == 4 + 4 + 4  # 1 (rest), 2, 3
    s.synced(taken.finished)
    assert answer(s, reply(FetchStatus.EPOCH_DONE, 0, g(1), g(2), g(3))) == 0.0
    assert s.exhausted and s.dropped_grants == 5 and s.local.remaining == 12
    rest = Taken()
    assert not s.take(20, 0, rest)  # out of data: asks once more before ending the epoch
    answer(s, reply(FetchStatus.EPOCH_DONE, 0, g(1), g(2), g(3)))
    assert s.take(20, 0, rest) and sorted(rest.ids) == list(range(4, 16))
    assert s.epoch_over(0)


def test_a_fetch_says_the_rank_share_of_the_batch_once_known() -> None:
    s = state(global_batch=1024)
    first = s.next_fetch()
    assert first is not None and (first.local_batch, first.global_batch) == (None, None)
    answer(s, reply(FetchStatus.OK, 0, g(0, size=128)))
    s.take(33, 0, Taken())  # the plan's local batch
    later = s.next_fetch(confirm=True)
    assert later is not None and (later.local_batch, later.global_batch) == (33, 1024)
    unknown = state()  # no global batch: an even share, as before
    unknown.take(33, 0, Taken())
    fetch = unknown.next_fetch()
    assert fetch is not None and fetch.local_batch is None


def test_a_share_must_be_whole_and_within_the_global_batch() -> None:
    ShardFetch(job="j", rank=0, epoch=0, local_batch=0, global_batch=8)  # a rank left out
    for bad in ({"local_batch": 4}, {"global_batch": 8}, {"local_batch": 9, "global_batch": 8}):
        with pytest.raises(ValidationError):
            ShardFetch(job="j", rank=0, epoch=0, **bad)


def test_a_service_that_knows_no_batch_share_is_asked_without_it() -> None:
    """An agent of this version against a shards service of an earlier one, which refuses
    fields it does not know: one refusal, then the fetch goes without them."""
    s = state(global_batch=1024)
    answer(s, reply(FetchStatus.OK, 0, g(0, size=128)))
    s.take(33, 0, Taken())
    refused = s.next_fetch(confirm=True)
    assert refused is not None and refused.local_batch == 33
    s.on_refused("bad_request", "local_batch: Extra inputs are not permitted")
    again = s.next_fetch(confirm=True)
    assert again is not None and (again.local_batch, again.global_batch) == (None, None)
    assert again.done == refused.done and s.fatal is None


def test_a_settle_is_final_only_once_every_done_ref_is_reported_and_none_held_elsewhere() -> None:
    s = state()
    answer(s, reply(FetchStatus.EPOCH_DONE, 0))
    s.pending_done = [ShardRef(epoch=0, shard=i, attempt=0) for i in range(70)]
    s.settle(0)
    first = s.next_fetch(confirm=True)
    assert first is not None and first.settle and first.want == 0 and len(first.done) == 64
    assert {r.shard for r in first.held} == set(range(64, 70))  # the rest: still its own
    told = ShardReply(job="j", epoch=0, status=FetchStatus.EPOCH_DONE, outstanding=6)
    assert answer_to(s, first, told) == 0.0 and s.settled is None  # the rest, at once
    second = s.next_fetch(confirm=True)
    assert second is not None and len(second.done) == 6
    held = ShardReply(
        job="j", epoch=0, status=FetchStatus.EPOCH_DONE, outstanding=1, retry_after_s=2.0
    )
    assert answer_to(s, second, held) == 2.0 and s.settled is None  # another rank's: wait
    third = s.next_fetch(confirm=True)
    assert third is not None and third.done == ()
    back = ShardReply(job="j", epoch=0, status=FetchStatus.OK, outstanding=0)
    assert answer_to(s, third, back) == 0.0 and s.settled is Settled.REOPENED
    assert s.next_fetch(confirm=True) is None  # nothing goes out until the group agreed
    s.end_settle(reopen=True)
    assert not s.exhausted and s.settling is None
    again = s.next_fetch(confirm=True)
    assert again is not None and not again.settle and again.want > 0


def _older(model: type[WireModel], *without: str) -> Decoder[Any]:
    """The decoder of a service of an earlier version: the model without later fields."""
    fields = {n: (f.annotation, f) for n, f in model.model_fields.items() if n not in without}
    return Decoder(create_model(f"Older{model.__name__}", __base__=WireModel, **fields))  # type: ignore[call-overload]


def test_new_fields_stay_off_the_wire_at_their_defaults() -> None:
    """So an earlier shards service takes this agent's ordinary fetches, and an earlier
    agent this service's ordinary replies: each refuses fields it does not know."""
    older = _older(ShardFetch, "settle", "local_batch", "global_batch")
    older.decode(encode(ShardFetch(job="j", rank=0, epoch=0, held=())))
    _older(ShardReply, "outstanding").decode(encode(reply(FetchStatus.OK, 0, g(0))))


def test_a_service_that_knows_no_settle_request_lets_the_group_leave_on_the_zero() -> None:
    """Against an earlier shards service, which refuses the settle field: the epoch ends
    on the step's zero as before, and the rank asks no more settle requests."""
    s = state()
    answer(s, reply(FetchStatus.EPOCH_DONE, 0))
    s.settle(0)
    request = s.next_fetch(confirm=True)
    assert request is not None and request.settle and request.want == 0
    with pytest.raises(Rejected) as refused:
        _older(ShardFetch, "settle").decode(encode(request))
    s.on_refused(refused.value.code, refused.value.reason)
    assert s.settled is Settled.FINISHED and s.fatal is None
    s.end_settle(reopen=False)
    s.settle(0)
    assert s.settled is Settled.FINISHED and s.next_fetch(confirm=True) is None


def test_a_settle_answered_by_a_done_reports_reply_that_the_job_is_done_is_over() -> None:
    """A done report in flight when the group ran out may be the one that finishes the
    job: its JOB_DONE answers the settle too (waiting for a settle reply instead hung,
    as nothing is sent once the job is done)."""
    s = state()
    answer(s, reply(FetchStatus.EPOCH_DONE, 0))
    s.pending_done = [ShardRef(epoch=0, shard=3, attempt=0)]
    report = s.next_fetch(confirm=True)
    assert report is not None and not report.settle
    s.settle(0)
    answer_to(s, report, reply(FetchStatus.JOB_DONE, 0))
    assert s.settled is Settled.FINISHED


def test_a_refused_unknown_field_is_named_in_the_reason() -> None:
    """What the fallback above reads: the bus names an unknown field in its refusal."""
    from antdt.runtime.bus import Rejected
    from antdt.runtime.bus.messages import Decoder

    request = ShardFetch(job="j", rank=0, epoch=0).model_dump()
    with pytest.raises(Rejected) as refused:
        Decoder(ShardFetch).decode(json.dumps({**request, "next_field": 1}).encode())
    assert refused.value.code == "bad_request" and "next_field" in refused.value.reason


def test_unconfirmed_refs_fall_due_in_the_order_they_were_last_sent() -> None:
    """`due` stops at the first ref not yet due; a ref listed again moves behind the
    others, with its new sending time."""
    unconfirmed = Unconfirmed()
    a, b, c = (ShardRef(epoch=0, shard=s, attempt=0) for s in range(3))
    unconfirmed.answered((a, b), 0.0)
    unconfirmed.answered((c,), 0.01)
    unconfirmed.answered((a,), 0.02)  # reported again, listed again
    assert unconfirmed.due(RECONFIRM_AFTER_S) == [b]
    assert unconfirmed.due(0.01 + RECONFIRM_AFTER_S) == [c]
    assert unconfirmed.refs() == [a]
    assert unconfirmed.due(0.02 + RECONFIRM_AFTER_S) == [a]
    assert len(unconfirmed) == 0
