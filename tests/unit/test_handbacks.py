"""handbacks.py: hand-backs announced at once, but at most once per job per window."""

from __future__ import annotations

from antdt.services.shards.handbacks import MAX_RANKS, HandBacks


def test_the_first_hand_back_is_announced_at_once() -> None:
    hb = HandBacks(every_s=1.0)
    assert hb.add("j", rank=3, returned=2, now=10.0) == 0.0
    held = hb.take("j", now=10.0)
    assert held is not None and (held.ranks, held.returned) == ([3], 2)
    assert hb.take("j", now=10.0) is None  # told once


def test_hand_backs_within_the_window_are_folded_into_one_at_its_end() -> None:
    hb = HandBacks(every_s=1.0)
    assert hb.add("j", 1, 2, now=10.0) == 0.0
    hb.take("j", now=10.0)
    assert hb.add("j", 2, 3, now=10.25) == 0.75  # at the window's end
    assert hb.add("j", 4, 1, now=10.5) is None  # that announcement carries this one too
    assert hb.add("j", 2, 1, now=10.6) is None
    held = hb.take("j", now=11.0)
    assert held is not None and (held.ranks, held.returned) == ([2, 4], 5)
    assert hb.add("j", 5, 1, now=12.5) == 0.0  # a window later: at once again


def test_jobs_are_announced_apart() -> None:
    hb = HandBacks(every_s=1.0)
    assert hb.add("a", 0, 1, now=1.0) == 0.0
    hb.take("a", now=1.0)
    assert hb.add("b", 0, 1, now=1.1) == 0.0  # another job: its own window


def test_an_announcement_names_at_most_max_ranks_and_counts_every_shard() -> None:
    hb = HandBacks(every_s=1.0)
    hb.add("j", 0, 1, now=0.0)
    for rank in range(1, MAX_RANKS + 10):
        hb.add("j", rank, 1, now=0.0)
    held = hb.take("j", now=0.0)
    assert held is not None and len(held.ranks) == MAX_RANKS and held.returned == MAX_RANKS + 10
