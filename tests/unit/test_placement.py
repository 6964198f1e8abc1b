"""Placement: rendezvous hashing spreads jobs over replicas, moves few when membership
changes, and a job its preferred replica does not claim is claimed after the grace."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from antdt.runtime.coordination.placement import ClaimPlan, preferred

JOBS = [f"job-{i}" for i in range(2000)]


def test_jobs_spread_evenly_over_replicas() -> None:
    replicas = ["m-a", "m-b", "m-c", "m-d"]
    counts = Counter(preferred(job, replicas) for job in JOBS)
    assert set(counts) == set(replicas)
    for n in counts.values():  # 500 expected each; a binomial sd is about 19
        assert 400 <= n <= 600, counts


def test_a_replica_leaving_moves_only_its_own_jobs() -> None:
    before = {job: preferred(job, ["m-a", "m-b", "m-c"]) for job in JOBS}
    after = {job: preferred(job, ["m-a", "m-c"]) for job in JOBS}
    moved = [job for job in JOBS if before[job] != after[job]]
    assert moved and all(before[job] == "m-b" for job in moved)
    assert len(moved) == sum(1 for owner in before.values() if owner == "m-b")


def test_a_replica_joining_takes_about_its_share_and_nothing_between_others() -> None:
    before = {job: preferred(job, ["m-a", "m-b"]) for job in JOBS}
    after = {job: preferred(job, ["m-a", "m-b", "m-c"]) for job in JOBS}
    moved = [job for job in JOBS if before[job] != after[job]]
    assert all(after[job] == "m-c" for job in moved)
    assert 550 <= len(moved) <= 780  # a third of 2,000


@given(
    st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=6, unique=True),
    st.text(max_size=12),
)
def test_every_replica_agrees_whatever_the_order_of_the_list(replicas: list[str], job: str) -> None:
    assert preferred(job, replicas) == preferred(job, list(reversed(replicas)))
    assert preferred(job, replicas) in replicas


def test_no_replicas_no_preference() -> None:
    assert preferred("j", []) is None


def _mine_and_not(me: str, other: str) -> tuple[str, str]:
    mine = next(j for j in JOBS if preferred(j, [me, other]) == me)
    theirs = next(j for j in JOBS if preferred(j, [me, other]) == other)
    return mine, theirs


def test_a_replica_claims_its_preferred_jobs_at_once_and_others_after_the_grace() -> None:
    plan = ClaimPlan("m-a", grace_s=5.0)
    mine, theirs = _mine_and_not("m-a", "m-b")
    replicas = ["m-a", "m-b"]
    assert plan.due([mine, theirs], owned=[], replicas=replicas, now=100.0) == [mine]
    assert plan.due([mine, theirs], owned=[], replicas=replicas, now=104.9) == [mine]
    # Unowned for the grace: m-b (dead, full or slow) did not take it.
    assert plan.due([mine, theirs], owned=[], replicas=replicas, now=105.0) == [mine, theirs]


def test_a_job_that_got_an_owner_starts_its_grace_afresh() -> None:
    plan = ClaimPlan("m-a", grace_s=5.0)
    _, theirs = _mine_and_not("m-a", "m-b")
    replicas = ["m-a", "m-b"]
    assert plan.due([theirs], owned=[], replicas=replicas, now=0.0) == []
    assert plan.due([theirs], owned=[theirs], replicas=replicas, now=3.0) == []
    # Its owner died: unowned again from 6 s, so not due before 11 s.
    assert plan.due([theirs], owned=[], replicas=replicas, now=6.0) == []
    assert plan.due([theirs], owned=[], replicas=replicas, now=10.9) == []
    assert plan.due([theirs], owned=[], replicas=replicas, now=11.0) == [theirs]


def test_owned_jobs_are_never_due_and_a_replica_missing_from_the_list_counts_itself() -> None:
    plan = ClaimPlan("m-new", grace_s=5.0)
    # Its member key is not written yet (or not read yet): it still takes its share.
    jobs = JOBS[:200]
    due = plan.due(jobs, owned=jobs[:100], replicas=["m-old"], now=0.0)
    assert not set(due) & set(jobs[:100])
    assert due == [j for j in jobs[100:] if preferred(j, ["m-old", "m-new"]) == "m-new"]
    assert plan.mine_first(due[0], ["m-old"])


def test_an_owner_hands_a_job_over_once_its_preferred_replica_has_settled() -> None:
    plan = ClaimPlan("m-a", grace_s=2.0)  # settles for as long by default
    mine, theirs = _mine_and_not("m-a", "m-b")
    members = {"m-a": 0.0, "m-b": 10.0}  # m-b joined at 10 s
    assert plan.hand_over([mine, theirs], members, now=11.9) is None
    assert plan.hand_over([mine, theirs], members, now=12.0) == theirs
    assert plan.hand_over([mine, theirs], members, now=12.0, movable=lambda job: False) is None
    assert plan.hand_over([mine], members, now=99.0) is None
    # m-b gone (its member key with its lease): nothing to hand it.
    assert plan.hand_over([mine, theirs], {"m-a": 0.0}, now=99.0) is None
