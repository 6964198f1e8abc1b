"""The chaos soak's fault schedule and table (antdt.testing.faults): seeded, balanced over
the kinds, never two faults of a group at once, bounded; every fault's lifecycle."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from antdt.testing.faults import (
    GROUP,
    FaultKind,
    FaultRecord,
    FaultState,
    Targets,
    advance,
    due,
    schedule,
    table,
)

EVERYTHING = Targets(
    ranks=["rank0", "rank1", "rank2", "rank3"],
    replicas=["monitor-a", "monitor-b", "shards-a", "shards-b"],
    nats=["nats0", "nats1", "nats2"],
    etcd=["etcd0", "etcd1", "etcd2"],
    hosts=["host0", "host1"],
    processes=["rank0", "shards-a"],
)


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    one = schedule(7, EVERYTHING, count=50)
    assert one == schedule(7, EVERYTHING, count=50)
    assert one != schedule(8, EVERYTHING, count=50)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_kind_comes_as_often_as_any_other_within_one(seed: int) -> None:
    faults = schedule(seed, EVERYTHING, count=7 * 40)
    counts = Counter(f.kind for f in faults)
    assert set(counts) == set(FaultKind)
    assert min(counts.values()) == 40 == max(counts.values())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_faults_of_one_group_never_overlap_and_come_about_every_15_s(seed: int) -> None:
    faults = schedule(seed, EVERYTHING, count=200, every_s=15.0, jitter_s=5.0)
    assert [f.number for f in faults] == list(range(200))
    assert all(b.at_s - a.at_s >= 10.0 - 1e-6 for a, b in itertools.pairwise(faults))
    last_end: dict[str, float] = {}
    for fault in faults:
        group = GROUP[fault.kind]
        assert fault.at_s >= last_end.get(group, 0.0), f"{fault} overlaps its group"
        last_end[group] = fault.until_s
        assert fault.target in EVERYTHING.of(fault.kind)
        assert 2.0 <= fault.hold_s <= 8.0


def test_kinds_without_targets_are_left_out() -> None:
    faults = schedule(3, Targets(ranks=["r0"], etcd=["e0", "e1", "e2"]), count=10)
    assert {f.kind for f in faults} == {FaultKind.KILL_RANK, FaultKind.KILL_ETCD}
    assert schedule(3, Targets(), count=10) == ()


def test_kinds_left_out_never_come_and_the_others_stay_balanced() -> None:
    # a driver without namespace hosts contends a host's CPU but cannot cut its link
    faults = schedule(3, EVERYTHING, count=60, leave_out=frozenset({FaultKind.CUT_LINK}))
    counts = Counter(f.kind for f in faults)
    assert FaultKind.CUT_LINK not in counts
    assert set(counts) == set(FaultKind) - {FaultKind.CUT_LINK}
    assert max(counts.values()) - min(counts.values()) <= 1


def test_due_hands_each_fault_out_once_over_consecutive_ticks() -> None:
    faults = schedule(5, EVERYTHING, count=30)
    handed = [f for t in range(0, 600) for f in due(faults, t - 1.0, float(t))]
    assert handed == list(faults)


def test_a_faults_lifecycle_and_the_transitions_it_refuses() -> None:
    fault = schedule(1, EVERYTHING, count=1)[0]
    record = FaultRecord(fault)
    record = advance(record, "injected", 15.0)
    record = advance(record, "undone", 20.0)
    record = advance(record, "recovered", 21.5, "replica b took the jobs over")
    assert (record.state, record.injected_s, record.recovered_s) == (
        FaultState.RECOVERED,
        15.0,
        21.5,
    )
    with pytest.raises(ValueError, match="injected from recovered"):
        advance(record, "injected", 30.0)
    with pytest.raises(ValueError, match="unknown fault event"):
        advance(FaultRecord(fault), "exploded", 1.0)
    failed = advance(advance(FaultRecord(fault), "injected", 1.0), "failed", 9.0, "job hung")
    assert failed.state is FaultState.FAILED and failed.note == "job hung"


def test_the_table_lists_each_fault_and_counts_kinds_and_states() -> None:
    faults = schedule(2, EVERYTHING, count=3)
    records = [
        advance(advance(FaultRecord(f), "injected", f.at_s), "recovered", f.at_s + 2.5, "back")
        for f in faults[:2]
    ] + [FaultRecord(faults[2])]
    text = table(records).splitlines()
    assert len(text) == 1 + 3 + 2
    assert text[1].split()[:2] == ["0", f"{faults[0].at_s:.1f}"] and "2.5" in text[1]
    assert text[-1] == "states: planned 1, recovered 2"
