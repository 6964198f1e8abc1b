"""Per-rank figures of a large job, brief enough for a log line or a span attribute. A
plan of 10,000 ranks listed in every action's log line and decide span buried the log
and made each span ~100 kB; the ActionRecord on ANTDT_ACTIONS keeps them all."""

from __future__ import annotations

from collections.abc import Sequence

#: Ranks listed in full; past this many, counted and summarized.
LISTED_RANKS = 64


def brief_batches(batches: Sequence[int] | None) -> object:
    """A plan's batches: listed up to LISTED_RANKS ranks, else their count, min, max and
    sum (what a reader checks: the bounds and the global batch kept)."""
    if batches is None or len(batches) <= LISTED_RANKS:
        return batches
    return {"ranks": len(batches), "min": min(batches), "max": max(batches), "sum": sum(batches)}


__all__ = ["LISTED_RANKS", "brief_batches"]
