"""Late offers (`share_late`): a rank whose head (the first quarter of its share) was slow
offers its tail in the middle of the step, so a burst's first step is shared too. Ranks
are threads on a real TCPStore, each with its own WorkSharing and claim store client;
their count all-reduce is a barrier."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from antdt.sharing import Pace, ShareParams, head_size, late_offer
from tests.unit.sharing_threads import (
    PER_SAMPLE_S,
    check_every_sample_once,
    helped,
    plan,
    run_steps,
)

dist = pytest.importorskip("torch.distributed")

WORLD, SHARE = 3, 16


def test_the_late_rule_compares_the_head_with_the_median_pace_of_the_last_step() -> None:
    paces = [Pace(1e-3), Pace(1.1e-3), Pace(0.9e-3)]
    assert late_offer(head_s=8 * 3e-3, head_samples=8, paces=paces, ratio=1.5)
    assert not late_offer(head_s=8 * 1.4e-3, head_samples=8, paces=paces, ratio=1.5)
    assert not late_offer(1.0, 8, [Pace(), Pace(), Pace(1e-3)], 1.5)  # one pace: no median
    assert not late_offer(1.0, 0, paces, 1.5)
    assert not late_offer(head_s=8 * 1.9e-3, head_samples=8, paces=paces, ratio=1.5)  # < 2x
    assert [head_size(n) for n in (0, 1, 3, 9, 512)] == [0, 0, 0, 2, 128]


def test_share_late_is_off_by_default_and_refuses_what_is_not_on_or_off() -> None:
    assert not ShareParams.from_params({"work_sharing": "on"}).late
    assert ShareParams.from_params({"work_sharing": "on", "share_late": "on"}).late
    assert ShareParams.from_params({"work_sharing": "on", "share_late": True}).late
    for bad in ("maybe", 1, 0.5):
        with pytest.raises(ValueError, match="share_late"):
            ShareParams.from_params({"share_late": bad})


def _run_steps(late: bool, slow: dict[int, set[int]], steps: int) -> tuple[list[Any], Any]:
    """Every rank's micro-batches over `steps` steps; `slow`: step -> ranks computing 4x
    slower in it."""
    by_step = {step: dict.fromkeys(ranks, 4.0) for step, ranks in slow.items()}
    return run_steps(ShareParams(True, 4, 1.5, late), by_step, steps, WORLD, SHARE)


def test_a_burst_first_step_is_shared_when_offers_may_come_late() -> None:
    steps, slow = 4, {2: {1}, 3: {1}}  # rank 1 slow from step 2 on; steps 0-1 give paces
    out, _server = _run_steps(True, slow, steps)
    check_every_sample_once(out, steps, WORLD, SHARE)
    assert helped(out, 1, 1) == 0  # healthy: no late offer
    assert helped(out, 2, 1) > 0  # the burst's first step: its tail was taken over
    assert helped(out, 3, 1) > 0  # then offered from the start of the step
    # The late offerer reports its share's time in one piece at its head's pace (4x)
    (one_piece,) = {c.one_piece_s for c in out if c.step == 2 and c.rank == 1}
    assert one_piece == pytest.approx(4 * PER_SAMPLE_S * SHARE, rel=0.3)


def test_without_late_offers_the_burst_first_step_is_paid_in_full() -> None:
    steps, slow = 4, {2: {1}, 3: {1}}
    out, _server = _run_steps(False, slow, steps)
    check_every_sample_once(out, steps, WORLD, SHARE)
    assert helped(out, 2, 1) == 0  # decided on the step before: one step late
    assert helped(out, 3, 1) > 0


def test_a_rank_stops_offering_once_its_burst_is_over() -> None:
    """Rank 1 is 4x slow in steps 2-3: it offers (at the step's start from step 3), and
    on its own pace again it stops within two steps, whatever the keep ratio: back on
    time, it computes its micro-batches before any helper is free, and with nobody
    helped its pace cannot be scaled to one piece (no helper, no offer)."""
    steps, slow = 8, {2: {1}, 3: {1}}
    out, _server = _run_steps(False, slow, steps)
    check_every_sample_once(out, steps, WORLD, SHARE)
    # An offered share is computed in `chunks` (4) micro-batches, by whoever holds them.
    pieces = [sum(1 for c in out if c.step == step and c.owner == 1) for step in range(steps)]
    assert pieces[3] == 4 and helped(out, 3, 1) > 0
    assert pieces[6:] == [1, 1], pieces


def test_late_keys_are_deleted_two_steps_on() -> None:
    steps = 8
    out, server = _run_steps(True, {s: {2} for s in range(2, steps)}, steps)
    check_every_sample_once(out, steps, WORLD, SHARE)
    # Per owner: ids in two slots and the last counter; the late keys of the last two
    # steps (decided, all, offers); the store's own key.
    assert server.num_keys() <= 1 + 3 * WORLD + 2 * 3


def test_a_decider_that_never_claims_releases_the_helpers_at_sync() -> None:
    """A rank whose script computes without claims() decides nothing after a head: its
    settle at sync says it offers nothing, and the helper waiting on it goes on."""
    from antdt.agent.claimstore import StoreClaims

    server = dist.TCPStore("127.0.0.1", 0, 3, True, wait_for_workers=False)
    helper = StoreClaims(dist.TCPStore("127.0.0.1", server.port, 3, False), 0, 2)
    silent = StoreClaims(dist.TCPStore("127.0.0.1", server.port, 3, False), 1, 2)
    for client in (helper, silent):
        client.open(0, {}, 4, None, frozenset({0, 1}))
    helper.decide_late(None)
    joined: list[bool] = []
    waiting = threading.Thread(target=lambda: joined.append(helper.join_late()))
    waiting.start()
    waiting.join(timeout=0.3)
    assert waiting.is_alive()  # waits for rank 1's decision
    silent.decide_late(None)  # what settle_late does at its sync
    waiting.join(timeout=10)
    assert joined == [False] and helper.claim_next() is None


def test_late_deciders_travel_as_one_bitmask_up_to_62_ranks_else_a_slot_each() -> None:
    from antdt.sharing import LATE_BITS, late_slots, read_late_slots

    for world in (4, LATE_BITS, LATE_BITS + 1):
        late = {0, 2, world - 1}
        parts = [late_slots(world, r, r in late) for r in range(world)]
        summed = [sum(column) for column in zip(*parts, strict=True)]
        assert len(summed) == (1 if world <= LATE_BITS else world)
        assert read_late_slots(summed, world) == late
    assert read_late_slots([], 4) == frozenset()


class _Recording:
    """A claim store client that records what each step opened with."""

    def __init__(self, rank: int) -> None:
        self.rank, self.world, self.opened = rank, WORLD, []

    def open(self, step: int, offers: dict[int, Any], *_rest: Any) -> None:
        self.opened.append((step, sorted(offers)))


def test_a_step_opened_again_at_an_epochs_end_keeps_its_offers() -> None:
    """The last epoch ran out of data at the step's count: the driver opens the same
    step index again for the next epoch, and the slow rank still offers in it."""
    from antdt.agent.shared_work import WorkSharing

    client = _Recording(0)
    sharing = WorkSharing(ShareParams(True, 4), lambda: client)  # type: ignore[arg-type,return-value]
    sharing.paces = [Pace(1e-3), Pace(1e-3), Pace(4e-3)]  # the exchange of step 29
    everyone = lambda v: [x * WORLD for x in v]  # noqa: E731  # the same share everywhere
    assert sharing.open(30, plan(WORLD, SHARE), 0, [], everyone) == 0  # epoch 0 has no data left
    assert sharing.open(30, plan(WORLD, SHARE), 0, list(range(SHARE)), everyone) == WORLD * SHARE
    assert client.opened == [(30, [2]), (30, [2])]
