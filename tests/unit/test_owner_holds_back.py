"""An offering rank (the owner) holds back its next micro-batch while the helpers would
have all its unclaimed ones computed before it finished that one, so a slow owner is
not the step's last rank; and it still draws when the helpers do not come."""

from __future__ import annotations

import math

import pytest

from antdt.sharing import Lane, Pace, ShareParams, helper_lanes, helpers_done, holds_back
from tests.unit.sharing_threads import PER_SAMPLE_S, check_every_sample_once, helped, run_steps

WORLD, SHARE, CHUNKS = 3, 16, 4
MICRO_S = PER_SAMPLE_S * SHARE / CHUNKS  # a micro-batch at normal speed


def test_helpers_take_the_next_micro_batch_as_each_comes_free() -> None:
    lanes = [Lane(free_at=1.0, micro_s=0.5), Lane(free_at=2.0, micro_s=0.25)]
    assert helpers_done(0.0, 0, lanes) == 0.0
    assert helpers_done(0.0, 1, lanes) == 1.5
    # 1.0-1.5 and 1.5-2.0 on the first; 2.0-2.25 on the second, which ends first
    assert helpers_done(0.0, 3, lanes) == 2.25
    assert helpers_done(3.0, 2, lanes) == 3.5  # both free by now: one each
    assert helpers_done(0.0, 1, []) == math.inf


def test_an_owner_holds_back_only_when_helpers_would_finish_before_its_next_one() -> None:
    lanes = [Lane(1.0, 0.25), Lane(1.0, 0.25)]
    # 3 left: the helpers are done at 1.5; the owner's next would end at 1.1 + 0.6
    assert holds_back(1.1, 0.6, 3, lanes)
    assert not holds_back(0.5, 0.6, 3, lanes)  # its next ends at 1.1, before them
    assert not holds_back(1.1, 0.6, 0, lanes)  # nothing left
    assert not holds_back(1.1, 0.6, 3, [])  # nobody helps


def test_helper_lanes_are_the_ranks_that_did_not_offer_at_their_last_paces() -> None:
    paces = [Pace(1e-3, 1.25e-3), Pace(4e-3), Pace(0.0), Pace(2e-3)]
    lanes = helper_lanes(paces, {1}, [100, 100, 100, 50], [0.01, 0, 0, 0.02], 10, 5.0)
    # rank 1 offered, rank 2's pace is unknown; rank 3 helped nobody: its own pace over
    # the one-piece ratio rank 0 measured (1e-3 / 1.25e-3)
    assert lanes == [
        Lane(5.0 + 0.1, pytest.approx(0.0125 + 0.01)),
        Lane(5.0 + 0.1, pytest.approx(0.025 + 0.02)),
    ]


def _owners_own(out: list, step: int, owner: int) -> list:
    return [c for c in out if c.step == step and c.owner == owner and c.rank == owner]


def test_a_slow_owner_leaves_its_last_micro_batches_to_the_helpers() -> None:
    """Rank 1 is 4x slow in steps 1 and 2 and offers in step 2 (one step late). Its first
    micro-batch takes 4 helper micro-batches' time; by then the helpers, done with their
    own, would finish its 3 others in 2 rounds, so it takes no second one."""
    params = ShareParams(True, CHUNKS, 1.5)
    steps, slow = 3, {1: {1: 4.0}, 2: {1: 4.0}}
    out, _server = run_steps(params, slow, steps, WORLD, SHARE)
    check_every_sample_once(out, steps, WORLD, SHARE)
    assert len(_owners_own(out, 2, 1)) == 1
    assert helped(out, 2, 1) == SHARE - SHARE // CHUNKS


def test_an_owner_draws_its_micro_batches_when_the_helpers_do_not_come() -> None:
    """In step 2 the helpers are 10x slow on their own shares (their last paces said
    fast): the owner holds back, finds nobody took a micro-batch, and computes its share
    itself, long before the helpers are free."""
    params = ShareParams(True, CHUNKS, 1.5)
    steps, slow = 3, {1: {1: 4.0}, 2: {0: 10.0, 1: 4.0, 2: 10.0}}
    out, _server = run_steps(params, slow, steps, WORLD, SHARE)
    check_every_sample_once(out, steps, WORLD, SHARE)
    owned = _owners_own(out, 2, 1)
    assert len(owned) == CHUNKS and helped(out, 2, 1) == 0
    helpers_free = min(c.end for c in out if c.step == 2 and c.rank != 1 and c.owner == c.rank)
    assert max(c.end for c in owned) < helpers_free


def test_an_owner_computes_its_first_micro_batch_before_it_holds_back() -> None:
    """Rank 1 was 8x slow in step 1 only: it offers in step 2 on that pace, but its pace
    in step 2 is known only from a micro-batch of it. At its normal speed it then
    finishes each of its micro-batches long before the helpers are free, so it keeps
    them (judged on step 1's pace it would have left them all to the helpers)."""
    params = ShareParams(True, CHUNKS, 1.5)
    out, _server = run_steps(params, {1: {1: 8.0}}, 3, WORLD, SHARE)
    check_every_sample_once(out, 3, WORLD, SHARE)
    assert len(_owners_own(out, 2, 1)) >= CHUNKS - 1
