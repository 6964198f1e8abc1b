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


def brief_ranks(ranks: Sequence[int], world_size: int) -> dict[str, object]:
    """Which of a job's ranks did something (acked, say): how many, and those of the
    `world_size` that did not, listed up to LISTED_RANKS."""
    done = set(ranks)
    missing = [r for r in range(world_size) if r not in done]
    return {"count": len(done), "missing": missing[:LISTED_RANKS]}


__all__ = ["LISTED_RANKS", "brief_batches", "brief_ranks"]
