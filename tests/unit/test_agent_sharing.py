"""Work sharing's ticket protocol: the pure rules (every offered micro-batch has exactly
one holder, whatever the order of draws), the offers, then the claim store on a real
TCPStore with ranks as threads."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from antdt.sharing import (
    BACK_TICKET,
    KEEP_OFFERING_RATIO,
    Pace,
    Refusal,
    Refused,
    ShareParams,
    StepShare,
    check_claim,
    cut,
    furthest_behind,
    helper_index,
    micro_samples,
    offering,
    owner_indices,
    worth_helping,
)

SHARE = StepShare(step=5, world=3, counts={1: 4, 2: 2})


def refusal(result: object) -> Refusal:
    assert isinstance(result, Refused), result
    return result.refusal


@settings(max_examples=300, deadline=None)
@given(count=st.integers(1, 12), draws=st.lists(st.integers(0, 3), max_size=40))
def test_tickets_from_both_ends_give_each_micro_batch_exactly_one_holder(
    count: int, draws: list[int]
) -> None:
    """Draws in any order: 0 is the owner's one front ticket, k > 0 a helper's; each
    side stops at its first refusal, as the client does. Every index is held once."""
    value, held, owner_done, helpers_done = 0, Counter[int](), False, set()
    for who in [*draws, *([0] * count), *range(1, 4)]:  # then everyone draws to the end
        if (who == 0 and owner_done) or who in helpers_done:
            continue
        if who == 0:
            value += 1
            got = owner_indices(count, value, 1)
            held.update(got)
            owner_done = len(got) == 0 or got.stop == count
        else:
            value += BACK_TICKET
            index = helper_index(count, value)
            if isinstance(index, Refused):
                helpers_done.add(who)
            else:
                held[index] += 1
    assert sorted(held) == list(range(count)) and set(held.values()) == {1}


def test_several_front_tickets_at_once_stop_where_the_helpers_began() -> None:
    value = 2 * BACK_TICKET + 3  # helpers hold 5 and 4 of 0..5; the owner drew 0..2
    assert owner_indices(6, value + 2, 2) == range(3, 4)
    assert owner_indices(6, value, 3) == range(0, 3)
    assert owner_indices(6, value + 3 + 3 * BACK_TICKET, 3) == range(3, 3)
    assert helper_index(6, value + BACK_TICKET) == 3
    assert refusal(helper_index(6, value + 1 + BACK_TICKET)) is Refusal.ALREADY_CLAIMED


def test_bad_claims_are_refused_with_their_reason() -> None:
    assert refusal(check_claim(SHARE, 0, 4, 1)) is Refusal.STEP_OVER
    assert refusal(check_claim(SHARE, 0, 6, 1)) is Refusal.STEP_NOT_OPEN
    assert refusal(check_claim(SHARE, 3, 5, 1)) is Refusal.OUTSIDE_JOB
    assert refusal(check_claim(SHARE, -1, 5, 1)) is Refusal.OUTSIDE_JOB
    assert refusal(check_claim(SHARE, 0, 5, 7)) is Refusal.OUTSIDE_JOB
    assert refusal(check_claim(SHARE, 1, 5, 0)) is Refusal.NOT_OFFERED
    assert check_claim(SHARE, 0, 5, 1) is None


def test_help_goes_to_the_rank_with_most_left() -> None:
    values = {1: 1, 2: 0}
    assert furthest_behind(SHARE, 0, values, set()) == 1  # 3 left against 2
    assert furthest_behind(SHARE, 0, {1: 1 + BACK_TICKET, 2: 0}, set()) == 1  # tie: lowest
    assert furthest_behind(SHARE, 0, values, {1}) == 2
    assert furthest_behind(SHARE, 1, values, set()) == 2  # never itself
    assert furthest_behind(SHARE, 0, {1: 4, 2: BACK_TICKET * 2}, set()) is None


def _whole(*own: float) -> list[Pace]:
    return [Pace(p) for p in own]


NONE: frozenset[int] = frozenset()


def test_ranks_offer_when_their_share_would_take_long_against_the_median() -> None:
    same = [8] * 4
    assert offering(_whole(0.0, 0.0, 0.0), NONE, same, 1.3) == NONE  # first step: unknown
    assert offering(_whole(1.0, 1.1, 0.9, 3.0), NONE, same, 1.3) == {3}
    assert offering(_whole(1.0, 1.25, 1.0, 1.0), NONE, same, 1.3) == NONE
    assert offering(_whole(1.0, 0.0, 2.0), NONE, same, 1.3) == {2}  # median of known: 12
    assert offering(_whole(3.0, 3.0, 1.0, 1.0), NONE, same, 1.3) == {0, 1}  # half: 16
    assert offering(_whole(5.0), NONE, same, 1.3) == NONE


def test_a_slow_rank_with_a_share_cut_to_its_speed_does_not_offer() -> None:
    """A persistent straggler that ADJUST_BS gave a third of the others' batch takes as
    long as they do: nothing to share (its micro-batches would only cost more)."""
    assert offering(_whole(1.0, 1.0, 1.0, 3.0), NONE, [12, 12, 12, 4], 1.3) == NONE
    assert offering(_whole(1.0, 1.0, 1.0, 3.0), NONE, [12, 12, 12, 8], 1.3) == {3}


def test_a_rank_that_offered_is_judged_at_its_pace_in_one_piece() -> None:
    """Micro-batches cost more per sample than a share in one piece: rank 3 at 1.5 on
    its micro-batches is as fast as the helpers, who took theirs at 1.5 against 1.0
    on their own shares."""
    same = [8] * 4
    recovered = [Pace(1.0, 1.5), Pace(1.0, 1.5), Pace(1.0, 1.4), Pace(1.5)]
    assert offering(recovered, frozenset({3}), same, 1.3) == NONE
    still_slow = [Pace(1.0, 1.5), Pace(1.0, 1.5), Pace(1.0, 1.4), Pace(4.5)]
    assert offering(still_slow, frozenset({3}), same, 1.3) == {3}
    nobody_helped = [Pace(1.0), Pace(1.0), Pace(1.0), Pace(4.5)]
    assert offering(nobody_helped, frozenset({3}), same, 1.3) == NONE


def test_a_rank_that_offered_keeps_offering_until_its_share_is_near_the_median() -> None:
    """A share 1.2x the median starts no offer at ratio 1.3, but keeps one going above
    KEEP_OFFERING_RATIO (1.1x); at 1.05x it stops. A straggler a plan had half healed
    otherwise offered on every other step (the simulator's non-dedicated cluster)."""
    same, was = [8] * 4, frozenset({3})
    helpers = [Pace(1.0, 1.0)] * 3  # as fast on micro-batches as in one piece: scale 1
    assert KEEP_OFFERING_RATIO == 1.1
    assert offering([*helpers, Pace(1.2)], NONE, same, 1.3) == NONE
    assert offering([*helpers, Pace(1.2)], was, same, 1.3) == {3}
    assert offering([*helpers, Pace(1.05)], was, same, 1.3) == NONE
    low = [*helpers, Pace(1.08)]  # the offer ratio below 1.1 bounds both
    assert offering(low, was, same, 1.05) == offering(low, NONE, same, 1.05) == {3}


def test_a_slow_rank_whose_tickets_cost_more_than_it_saves_does_not_offer() -> None:
    """Rank 3's share takes 24 against the median's 8: offered, its 4 tickets' round
    trips must stay under half its excess of 16."""
    same, slow = [8] * 4, _whole(1.0, 1.0, 1.0, 3.0)
    assert offering(slow, NONE, same, 1.3, [0.0, 0.0, 0.0, 1.9], chunks=4) == {3}
    assert offering(slow, NONE, same, 1.3, [0.0, 0.0, 0.0, 2.0], chunks=4) == NONE
    assert offering(slow, NONE, same, 1.3, [5.0, 5.0, 5.0, 0.0], chunks=4) == {3}


def test_a_helper_takes_tickets_only_where_its_round_trip_is_worth_it() -> None:
    # A micro-batch of 4 samples at 10 ms each: 40 ms of the owner's; a round trip of
    # 20 ms or more costs the step as much as half of that saves.
    assert worth_helping(0.019, 4, 0.010)
    assert not worth_helping(0.020, 4, 0.010)
    assert worth_helping(5.0, 4, 0.0)  # the owner's pace unknown: helped
    assert micro_samples(10, 0, 4) == 3 and micro_samples(10, 4, 8) == 4


def test_cut_uses_the_plans_micro_batch_else_chunks() -> None:
    ids = list(range(10))
    assert cut(ids, 4) == [ids[:4], ids[4:8], ids[8:]]
    assert cut(ids, 0, chunks=4) == [ids[:3], ids[3:6], ids[6:9], ids[9:]]
    assert cut([], 0) == []
    assert cut([1], 0, chunks=4) == [[1]]


def test_share_params_default_off() -> None:
    assert ShareParams.from_params({}) == ShareParams(False)
    on = ShareParams.from_params({"work_sharing": "on", "share_chunks": 6, "share_ratio": 1.5})
    assert on == ShareParams(True, 6, 1.5)
    assert not ShareParams.from_params({"work_sharing": False}).enabled
    for bad in ({"work_sharing": "maybe"}, {"share_chunks": 0}, {"share_ratio": 0.9}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ShareParams.from_params(bad)  # type: ignore[arg-type]


def test_share_params_on_by_default_under_antdt_nd_only() -> None:
    assert ShareParams.from_params({}, "antdt-nd") == ShareParams(True, 8, 1.5)
    assert ShareParams.from_params({"work_sharing": "on"}, "antdt-nd").enabled
    assert not ShareParams.from_params({"work_sharing": "off"}, "antdt-nd").enabled
    assert not ShareParams.from_params({}, "lb-bsp").enabled
    assert not ShareParams.from_params({}, "antdt-dd").enabled
    assert ShareParams.from_params({"work_sharing": "on"}, "lb-bsp").enabled


# -- the claim store on a real TCPStore ------------------------------------------------


def _stores(world: int) -> tuple[object, list[object]]:
    dist = pytest.importorskip("torch.distributed")
    server = dist.TCPStore("127.0.0.1", 0, world + 1, True, wait_for_workers=False)
    clients = [dist.TCPStore("127.0.0.1", server.port, world + 1, False) for _ in range(world)]
    return server, clients


def _open(clients: list[object], step: int, own: dict[int, list[int]], micro: int = 1) -> None:
    """Open `step` on every client with the offers of `own`, as their all-reduce would."""
    from antdt.agent.claimstore import StoreClaims

    offers = {o: (len(ids), micro) for o, ids in own.items()}
    for client in clients:
        assert isinstance(client, StoreClaims)
        client.open(step, offers, 8, own.get(client.rank))


def test_store_refuses_bad_claims_and_double_claims() -> None:
    from antdt.agent.claimstore import Claimed, StoreClaims

    _server, (s0, s1) = _stores(2)
    ranks = [StoreClaims(s0, 0, 2), StoreClaims(s1, 1, 2)]
    _open(ranks, 7, {0: [1, 2, 3]}, micro=2)  # rank 0 offers [1, 2] and [3]
    got = ranks[1].claim_help(7, 0)
    assert isinstance(got, Claimed) and got.ids == [3] and got.index == 1
    assert [c.ids for c in ranks[0].claim_own(7, 2)] == [[1, 2]]  # [3] is the helper's
    assert ranks[0].claim_own(7) == []
    assert refusal(ranks[1].claim_help(7, 0)) is Refusal.ALREADY_CLAIMED
    assert refusal(ranks[1].claim_help(7, 5)) is Refusal.OUTSIDE_JOB
    assert refusal(ranks[0].claim_help(7, 1)) is Refusal.NOT_OFFERED
    assert refusal(ranks[1].claim_help(6, 0)) is Refusal.STEP_OVER
    assert refusal(ranks[1].claim_help(8, 0)) is Refusal.STEP_NOT_OPEN
    _open(ranks, 8, {1: [9]})
    assert refusal(ranks[0].claim_help(7, 1)) is Refusal.STEP_OVER
    with pytest.raises(ValueError):
        StoreClaims(s0, 2, 2)


def _work(rank: int, claims: object, slow: float, out: list[tuple[int, int, int]]) -> None:
    from antdt.agent.claimstore import StoreClaims

    assert isinstance(claims, StoreClaims)
    while (held := claims.claim_next()) is not None:
        time.sleep(slow)  # threads in one process: sleeping frees the GIL for the others
        out.append((rank, held.owner, held.index))


def test_ranks_as_threads_claim_every_micro_batch_once_and_help_the_slow_one() -> None:
    from antdt.agent.claimstore import StoreClaims

    world, per_rank = 3, 8
    _server, stores = _stores(world)
    ranks = [StoreClaims(s, r, world) for r, s in enumerate(stores)]
    for step in range(3):
        own = {r: [r * 100 + step * 10 + i for i in range(per_rank)] for r in range(world)}
        _open(ranks, step, own)  # every rank offers: all tickets, from both ends
        out: list[tuple[int, int, int]] = []
        slow = [0.02, 0.001, 0.001]  # rank 0 is slow
        threads = [
            threading.Thread(target=_work, args=(r, ranks[r], slow[r], out)) for r in range(world)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        counts = Counter((owner, index) for _, owner, index in out)
        assert set(counts) == {(o, i) for o in range(world) for i in range(per_rank)}
        assert max(counts.values()) == 1
        helped = [(r, i) for r, o, i in out if o == 0 and r != 0]
        assert helped, "the fast ranks took none of the slow rank's micro-batches"
        own_order = sorted(i for r, o, i in out if o == 0 and r == 0)
        assert own_order == list(range(len(own_order)))  # the owner kept its order


def test_a_claim_costs_well_under_a_millisecond_on_loopback() -> None:
    from antdt.agent.claimstore import StoreClaims

    _server, (s0, s1) = _stores(2)
    owner, helper = StoreClaims(s0, 0, 2), StoreClaims(s1, 1, 2)
    n = 400
    _open([owner, helper], 0, {0: list(range(n))})
    t0 = time.perf_counter()
    for _ in range(n // 2):
        assert owner.claim_next() is not None
    own_s = (time.perf_counter() - t0) / (n // 2)
    t0 = time.perf_counter()
    for _ in range(n // 2):
        assert helper.claim_next() is not None
    steal_s = (time.perf_counter() - t0) / (n // 2)
    assert owner.claim_next() is None and helper.claim_next() is None
    print(f"claim on loopback: own {own_s * 1e6:.0f} us, helping {steal_s * 1e6:.0f} us")
    assert own_s < 1e-3 and steal_s < 1e-3


def test_the_store_holds_at_most_three_keys_per_owner() -> None:
    from antdt.agent.claimstore import StoreClaims

    server, (s0, s1) = _stores(2)
    ranks = [StoreClaims(s0, 0, 2), StoreClaims(s1, 1, 2)]
    counts = []
    for step in range(8):
        _open(ranks, step, {0: [step * 2, step * 2 + 1]} if step % 3 else {})
        while ranks[0].claim_next() is not None or ranks[1].claim_next() is not None:
            pass
        counts.append(server.num_keys())  # type: ignore[attr-defined]
    # Step 0 offered nothing (the store's own key); then ids in two slots and the counter
    # of the last offer: the count stops growing.
    assert counts[0] == 1 and max(counts) == counts[-1] == 1 + 3, counts


def test_a_helper_skips_an_owner_whose_micro_batches_take_less_than_its_round_trip() -> None:
    from antdt.agent.claimstore import StoreClaims

    _server, (s0, s1) = _stores(2)
    owner, helper = StoreClaims(s0, 0, 2), StoreClaims(s1, 1, 2)
    assert helper.round_trip_s == 0.0  # unknown until its first ticket
    offers = {0: (8, 1)}
    for step, pace, helped in ((0, 1.0, True), (1, 1e-9, False), (2, 0.0, True)):
        for client in (owner, helper):
            client.open(
                step, offers, 8, list(range(8)) if client is owner else None, paces={0: pace}
            )
        got = helper.claim_next()
        assert (got is not None) is helped, (step, pace)
        assert 0 < helper.round_trip_s < 0.5
        while owner.claim_next() is not None:
            pass


class _Delayed:
    """A real store whose calls first wait `delay_s` (settable): a link, or a throttle."""

    def __init__(self, store: object) -> None:
        self._store, self.delay_s = store, 0.0

    def __getattr__(self, name: str) -> object:
        call = getattr(self._store, name)

        def delayed(*args: object) -> object:
            time.sleep(self.delay_s)
            return call(*args)

        return delayed


def test_the_round_trip_is_the_fastest_of_the_last_tickets() -> None:
    """One slow ticket (a throttled wait) does not make a fast link look slow; a link
    that slowed shows within TRIPS_KEPT tickets."""
    from antdt.agent.claimstore import TRIPS_KEPT, StoreClaims

    _server, (s0, _s1) = _stores(2)
    link = _Delayed(s0)
    owner = StoreClaims(link, 0, 2)
    owner.open(0, {0: (64, 1)}, 8, list(range(64)))
    for delay in (0.0, 0.0, 0.05):
        link.delay_s = delay
        assert owner.claim_next() is not None
    assert owner.round_trip_s < 0.02
    link.delay_s = 0.03
    for _ in range(TRIPS_KEPT):
        assert owner.claim_next() is not None
    assert owner.round_trip_s >= 0.03


# -- the count's part of an offering rank, through the store --------------------------


def test_a_posted_count_part_is_read_under_its_own_tag_only() -> None:
    from antdt.agent.claimstore import StoreClaims

    _server, (s0, s1) = _stores(2)
    partner, owner = StoreClaims(s0, 0, 2), StoreClaims(s1, 1, 2)
    owner.post_part((1, 0, 5), [3, 3, 7])
    assert partner.read_part((1, 0, 5), 1) == [3, 3, 7]
    partner.post_sum((1, 0, 5), 1, [5, 3, 9])
    assert owner.read_sum((1, 0, 5)) == [5, 3, 9]
    # Count 3 shares count 1's slot; a part for another epoch's count 3 (posted for a
    # step that never came) is not the one wanted either: the reader waits for its own.
    owner.post_part((3, 1, 6), [9, 9, 9])
    got: list[list[int]] = []
    reader = threading.Thread(target=lambda: got.append(partner.read_part((3, 0, 6), 1)))
    reader.start()
    time.sleep(0.05)
    assert not got, "read a part posted under another tag"
    owner.post_part((3, 0, 6), [4, 4, 8])
    reader.join(timeout=5)
    assert got == [[4, 4, 8]]


def test_a_count_passes_between_an_offering_rank_and_its_partner_without_a_wait() -> None:
    """A send waits for its receiver; a post does not: the partner goes on."""
    from antdt.agent.claimstore import StoreClaims
    from antdt.agent.shared_work import CountPosts

    _server, (s0, s1) = _stores(2)
    partner = CountPosts(StoreClaims(s0, 0, 2), (2, 0, 4))
    owner = CountPosts(StoreClaims(s1, 1, 2), (2, 0, 4))
    owner.post([6, 6, 6])
    assert partner.read(1) == [6, 6, 6]
    started = time.perf_counter()
    partner.post_sum(1, [9, 6, 7])  # the owner reads it when it comes, later
    assert time.perf_counter() - started < 1.0
    assert owner.read_sum() == [9, 6, 7]


def test_count_parts_and_sums_add_at_most_four_keys_per_owner() -> None:
    from antdt.agent.claimstore import StoreClaims

    server, (s0, s1) = _stores(2)
    ranks = [StoreClaims(s0, 0, 2), StoreClaims(s1, 1, 2)]
    counts = []
    for step in range(8):
        ranks[0].post_part((step + 1, 0, step), [2, 2])
        ranks[1].post_sum((step + 1, 0, step), 0, [3, 2])
        assert ranks[0].read_sum((step + 1, 0, step)) == [3, 2]
        _open(ranks, step, {0: [step * 2, step * 2 + 1]})
        while ranks[0].claim_next() is not None or ranks[1].claim_next() is not None:
            pass
        counts.append(server.num_keys())  # type: ignore[attr-defined]
    # The store's own key, the ids in two slots, the last offer's counter, and two slots
    # each of the count's part and sum.
    assert max(counts) == counts[-1] == 1 + 3 + 4, counts
