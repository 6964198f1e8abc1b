"""When to announce hand-backs (ShardsReturned): the first at once, then at most once per
job every `every_s` seconds, folding those within the window into one at its end (each
announcement makes every waiting rank of the job ask again). Pure: the caller passes the
time and does the waiting and the publishing."""

from __future__ import annotations

from dataclasses import dataclass, field

from antdt.runtime.recent import Recent

#: Jobs whose last announcement is remembered (the window only matters for a few).
REMEMBERED_JOBS = 4096
#: Most ranks named in one announcement; the count of shards covers them all.
MAX_RANKS = 1024


@dataclass
class Held:
    """Hand-backs not announced yet."""

    returned: int = 0
    ranks: list[int] = field(default_factory=list)

    def add(self, rank: int, returned: int) -> None:
        self.returned += returned
        if len(self.ranks) < MAX_RANKS and rank not in self.ranks:
            self.ranks.append(rank)


class HandBacks:
    """Hand-backs of each job to announce, and when."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._last: Recent[float] = Recent(REMEMBERED_JOBS)  # job -> last announced at
        self._held: dict[str, Held] = {}

    def add(self, job: str, rank: int, returned: int, now: float) -> float | None:
        """Record a hand-back of `returned` shards by `rank` at `now`: in how many
        seconds to announce what is held for the job (0: at once), or None when an
        announcement is due already and will carry this one too."""
        held = self._held.get(job)
        if held is not None:
            held.add(rank, returned)
            return None
        self._held[job] = held = Held()
        held.add(rank, returned)
        last = self._last.get(job)
        return 0.0 if last is None else max(0.0, last + self.every_s - now)

    def take(self, job: str, now: float) -> Held | None:
        """What to announce for `job` now (None: nothing), as announced at `now`."""
        held = self._held.pop(job, None)
        if held is not None:
            self._last.put(job, now)
        return held
