"""Which replica of a service should own which job: rendezvous hashing over the member list,
the same answer on every replica; a replica joining or leaving moves only its share.
Preference steers claims and guards nothing (ownership is the lease-bound etcd key); a job
unowned for `grace_s` is claimed by anyone, and an owner hands a job to its preferred
replica once that one has been a member for `settle_s`. Pure: time is an argument."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence


def _score(replica: str, job: str) -> bytes:
    return hashlib.blake2b(f"{replica}\x00{job}".encode(), digest_size=8).digest()


def preferred(job: str, replicas: Iterable[str]) -> str | None:
    """The replica that should own `job` among `replicas` (None if there are none)."""
    return max(replicas, key=lambda replica: _score(replica, job), default=None)


def _with(me: str, replicas: Iterable[str]) -> list[str]:
    """The member list with this replica in it: its own key may not be written or read
    yet, and it takes its share all the same."""
    members = list(replicas)
    return members if me in members else [*members, me]


class ClaimPlan:
    """A replica's claim decisions over rounds: which unowned jobs to try to claim now.

    A job is tried at once when this replica is its preferred one, and by any replica
    once it has been unowned for `grace_s` (its preferred replica did not take it)."""

    def __init__(self, me: str, grace_s: float, settle_s: float | None = None) -> None:
        self.me = me
        self.grace_s = grace_s
        self.settle_s = grace_s if settle_s is None else settle_s
        self._unowned_since: dict[str, float] = {}  # job -> first seen unowned (s)

    def due(
        self, live: Iterable[str], owned: Iterable[str], replicas: Sequence[str], now: float
    ) -> list[str]:
        """Of the `live` jobs, those to claim now, given the jobs that have an owner
        (`owned`, any replica's) and the service's replicas; remembers what it saw."""
        has_owner = set(owned)
        members = _with(self.me, replicas)
        seen: dict[str, float] = {}
        due = []
        for job in live:
            if job in has_owner:
                continue
            since = seen[job] = self._unowned_since.get(job, now)
            if preferred(job, members) == self.me or now - since >= self.grace_s:
                due.append(job)
        self._unowned_since = seen  # jobs owned or gone meanwhile are forgotten
        return due

    def mine_first(self, job: str, replicas: Sequence[str]) -> bool:
        """Should this replica claim `job` at first sight (its rank's hello)? Only if it
        is the job's preferred replica; the others leave it to the claim rounds."""
        return preferred(job, _with(self.me, replicas)) == self.me

    def hand_over(
        self,
        owned: Iterable[str],
        members: Mapping[str, float],
        now: float,
        movable: Callable[[str], bool] = lambda job: True,
    ) -> str | None:
        """Of the jobs this replica owns, one to hand over to its preferred replica: one
        that has been a member (since `members[replica]`, s) for `settle_s`, and that
        `movable` allows (say, not being taken on). None if there is none."""
        replicas = _with(self.me, members)
        for job in owned:
            to = preferred(job, replicas)
            if to is None or to == self.me or now - members[to] < self.settle_s:
                continue
            if movable(job):
                return job
        return None
