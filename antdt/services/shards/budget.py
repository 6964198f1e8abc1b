"""A job's ledger-write budget: a token bucket of bytes. Pure: time is an argument."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WriteBudget:
    """`burst_s` seconds of `bytes_per_s`: a write takes its bytes (the bucket may go into
    debt) and the next one waits until the bucket is back at zero. A job that never
    empties it never waits. bytes_per_s 0: no budget."""

    bytes_per_s: float
    burst_s: float
    tokens: float | None = None  # None: a full bucket
    counted_at: float = 0.0  # monotonic time `tokens` was counted

    def spend(self, written: int, now: float) -> None:
        """Take a write's bytes from the bucket."""
        rate, capacity = self.bytes_per_s, self.bytes_per_s * self.burst_s
        tokens = capacity if self.tokens is None else self.tokens + (now - self.counted_at) * rate
        self.tokens, self.counted_at = min(capacity, tokens) - written, now

    def due(self) -> float:
        """Monotonic time before which the next write must wait (0.0: none)."""
        if self.tokens is None or self.tokens >= 0:
            return 0.0
        return self.counted_at - self.tokens / self.bytes_per_s
