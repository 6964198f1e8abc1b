"""Counts of what the controller did per job (events handled, decisions, records), for
tests and operators; bounded, since job ids come off the wire."""

from __future__ import annotations

from collections import Counter

from antdt.runtime.recent import Recent

#: Jobs counted, at most (the least recently counted are forgotten first).
MAX_JOBS = 4096


class JobCounts:
    def __init__(self, limit: int = MAX_JOBS) -> None:
        self._jobs: Recent[Counter[str]] = Recent(limit)

    def add(self, job: str, what: str) -> None:
        counts = self._jobs.get(job) or Counter()
        counts[what] += 1
        self._jobs.put(job, counts)

    def __getitem__(self, key: tuple[str, str]) -> int:
        """The count of (job, what); 0 when never counted."""
        counts = self._jobs.get(key[0])
        return counts[key[1]] if counts else 0
