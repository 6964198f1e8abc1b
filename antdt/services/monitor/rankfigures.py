"""Each rank's latest window figures as the Judge keeps them: those in its multisets
(held) and those closed since its last renewal (queued), rows of arrays grown as ranks
come. Pure, no clock. A close of 10,000 windows queues, and a renewal holds, their
figures in a few numpy calls, with no tuple per rank; a rank alone reads and writes its
row as a tuple (None for none)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

#: What the Judge keeps of a rank's latest window: level, busy per sample, data share,
#: comm share, link round trip (None: not measured), in the order of its multisets.
Figures = tuple[float, float, float, float, float | None]
FIELDS = 5
#: The figures of a rank that holds none.
NOTHING: Figures = (None, None, None, None, None)  # type: ignore[assignment]


class RankFigures:
    """Per rank, its figures held (`held`, NaN: none; `holding`: it holds some) and its
    figures queued (`queue`, `queued`); `holders` and `waiting` count them."""

    __slots__ = ("_views", "held", "holders", "holding", "queue", "queued", "waiting")

    def __init__(self, ranks: int = 0) -> None:
        self.held: Floats = np.full((ranks, FIELDS), np.nan)
        self.holding: Bools = np.zeros(ranks, dtype=np.bool_)
        self.queue: Floats = np.full((ranks, FIELDS), np.nan)
        self.queued: Bools = np.zeros(ranks, dtype=np.bool_)
        self.holders = 0  # ranks holding figures
        self.waiting = 0  # ranks with figures queued
        self._views = self._viewed()

    def _viewed(self) -> tuple[memoryview, ...]:
        """The arrays as memoryviews (held, holding, queue, queued): a rank alone reads
        and writes its elements at a fraction of numpy's cost."""
        return tuple(a.data for a in (self.held, self.holding, self.queue, self.queued))

    def grow(self, top: int) -> None:
        """Rows up to rank `top` (>= 0) at least."""
        size = len(self.holding)
        if top < size:
            return
        more = max(top + 1, 2 * size) - size
        self.held = np.vstack((self.held, np.full((more, FIELDS), np.nan)))
        self.queue = np.vstack((self.queue, np.full((more, FIELDS), np.nan)))
        self.holding = np.concatenate((self.holding, np.zeros(more, dtype=np.bool_)))
        self.queued = np.concatenate((self.queued, np.zeros(more, dtype=np.bool_)))
        self._views = self._viewed()

    def held_of(self, rank: int) -> Figures:
        """The rank's figures held (`NOTHING`: none)."""
        held, holding = self._views[0], self._views[1]
        if rank >= len(holding) or not holding[rank]:
            return NOTHING
        return _read(held, rank)

    def hold(self, rank: int, figures: Figures) -> None:
        """The rank's figures held are now `figures` (the caller's multisets swapped)."""
        self.grow(rank)
        held, holding = self._views[0], self._views[1]
        self.holders += not holding[rank]
        holding[rank] = True
        _write(held, rank, figures)

    def queue_one(self, rank: int, figures: Figures) -> None:
        """The rank's new figures, queued (none of its own queued: the caller held it)."""
        self.grow(rank)
        _write(self._views[2], rank, figures)
        self._views[3][rank] = True
        self.waiting += 1

    def queue_many(self, rows: Ints, figures: Floats) -> None:
        """`queue_one` of each of `rows` (distinct, none queued), a row of `figures` each."""
        if not len(rows):
            return
        self.grow(int(rows.max()))
        self.queue[rows] = figures
        self.queued[rows] = True
        self.waiting += len(rows)

    def unqueue(self, rank: int) -> Figures:
        """The rank's queued figures, no longer queued."""
        self._views[3][rank] = False
        self.waiting -= 1
        return _read(self._views[2], rank)

    def is_queued(self, rank: int) -> bool:
        """Whether the rank has figures queued."""
        queued = self._views[3]
        return rank < len(queued) and bool(queued[rank])

    def hold_queued(self) -> Ints:
        """Every queued rank's figures held now, none queued: those ranks, ascending."""
        rows = np.flatnonzero(self.queued)
        self.holders += int(np.count_nonzero(~self.holding[rows]))
        self.held[rows] = self.queue[rows]
        self.holding[rows] = True
        self.queued[rows] = False
        self.waiting = 0
        return rows

    def held_column(self, at: int) -> Floats:
        """Figure `at` of every rank holding figures, NaN where one has none, by rank."""
        return self.held[self.holding, at]


def _read(rows: memoryview, rank: int) -> Figures:
    """The rank's row of `rows` (a 2-D view) as figures: None for a NaN round trip."""
    level, busy, data, comm, link = (rows[rank, k] for k in range(FIELDS))
    return (level, busy, data, comm, None if link != link else link)


def _write(rows: memoryview, rank: int, figures: Figures) -> None:
    """`figures` into the rank's row of `rows` (a 2-D view): NaN for None."""
    for k, value in enumerate(figures):
        rows[rank, k] = np.nan if value is None else value  # type: ignore[call-overload]


__all__ = ["FIELDS", "NOTHING", "Figures", "RankFigures"]
