"""How long a client waits between attempts at a server that is not up yet, and which
attempts it says so for. Pure: the caller sleeps and logs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Delays from `first_s`, doubling up to `max_s`; `deadline_s` None: forever."""

    first_s: float
    max_s: float
    deadline_s: float | None = None

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1: the first)."""
        return float(min(self.max_s, self.first_s * 2 ** min(attempt - 1, 62)))

    def gives_up(self, waited_s: float) -> bool:
        return self.deadline_s is not None and waited_s >= self.deadline_s

    @staticmethod
    def worth_reporting(attempt: int) -> bool:
        """Attempts 1, 2, 4, 8, ...: a waiting service says so, less often as it waits."""
        return attempt & (attempt - 1) == 0
