"""How much of the controller's core one job's incident decisions may take (pure, time
passed in).

A policy decides at once on every incident transition. A job of thousands of ranks on a
non-dedicated cluster makes 100-140 transitions a second of its time, and a decision
with a crowd of stragglers open costs up to 15-20 ms: one such job can take a third of
a core, several can starve every other job's decisions and the bus's own reads. Each job
gets a token bucket of CPU seconds: it fills at `share` seconds a second up to
`burst_s`, and every decision on the job (health or incident) spends the CPU time it
took. While the bucket is empty, the job's incident transitions are learnt (the job's
view holds every open incident) but not decided on one by one: its next health
decision, once a second, decides on all of them. A health decision is never deferred.
"""

from __future__ import annotations

from dataclasses import dataclass

from antdt.runtime.recent import Recent

#: Jobs whose buckets are kept, at most (owned jobs; the least recently used go first).
MAX_JOBS = 4096


@dataclass(slots=True)
class Bucket:
    """One job's CPU seconds left to spend (negative: owed) as of `at` (monotonic s)."""

    left_s: float
    at: float
    deferred: int = 0  # incident transitions deferred since the last incident decision


class DecisionBudget:
    """The token buckets of the jobs a controller decides for."""

    def __init__(self, share: float, burst_s: float, limit: int = MAX_JOBS) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], not {share}")
        if burst_s <= 0.0:
            raise ValueError(f"burst_s must be above 0, not {burst_s}")
        self.share, self.burst_s = share, burst_s
        self._buckets: Recent[Bucket] = Recent(limit)

    def allows(self, job: str, now: float) -> bool:
        """Whether an incident decision on `job` may run at `now`: its bucket is not empty."""
        return self._filled(job, now).left_s > 0.0

    def spend(self, job: str, now: float, cpu_s: float) -> None:
        """A decision on `job` took `cpu_s` CPU seconds, ending at `now`. The bucket may go
        below 0: a decision is not cut short, the job's next ones wait longer."""
        bucket = self._filled(job, now)
        bucket.left_s -= max(0.0, cpu_s)

    def defer(self, job: str, now: float) -> int:
        """An incident transition of `job` is left to its next health decision: how many
        have been since its last incident decision (1: this is the first)."""
        bucket = self._filled(job, now)
        bucket.deferred += 1
        return bucket.deferred

    def decided(self, job: str, now: float) -> int:
        """An incident decision on `job` runs: how many transitions were deferred before
        it (0: none), counted afresh from here."""
        bucket = self._filled(job, now)
        deferred, bucket.deferred = bucket.deferred, 0
        return deferred

    def left_s(self, job: str, now: float) -> float:
        """The job's CPU seconds left at `now` (negative: owed)."""
        return self._filled(job, now).left_s

    def forget(self, job: str) -> None:
        self._buckets.pop(job)

    def _filled(self, job: str, now: float) -> Bucket:
        bucket = self._buckets.get(job)
        if bucket is None:
            bucket = Bucket(self.burst_s, now)
        elif now > bucket.at:  # a clock that stepped back fills nothing
            bucket.left_s = min(self.burst_s, bucket.left_s + self.share * (now - bucket.at))
            bucket.at = now
        self._buckets.put(job, bucket)
        return bucket


__all__ = ["DecisionBudget"]
