"""Jobs whose ranks all exited, as the controller infers it from the monitor's last
health of them. The one place that knows it: their late events load nothing, and a
hello, a health that steps on or a registration makes a job live again."""

from __future__ import annotations

from antdt.runtime.recent import Recent
from antdt.schemas import JobHealth, RankState

#: Ended jobs remembered, at most (the least recently ended are forgotten first).
MAX_ENDED = 4096


class EndedJobs:
    def __init__(self, limit: int = MAX_ENDED) -> None:
        self._jobs: Recent[None] = Recent(limit)

    def __contains__(self, job: object) -> bool:
        return job in self._jobs

    def add(self, job: str) -> None:
        self._jobs.put(job, None)

    def live_again(self, job: str) -> None:
        self._jobs.pop(job)


def job_ended(health: JobHealth) -> bool:
    """Every rank's process finished or closed (the monitor's last health of the job)."""
    return all(r.state is RankState.EXITED for r in health.ranks)
