"""A ledger's in-flight entries, shared between successive states, so that an operation
costs what it changes, not what the job holds: a shared, never-changed base plus a small
delta, folded into a new base once it outgrows `_compact_at(base)`. Order is grant order;
a shard dropped and granted again before the next fold keeps its first place."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar, overload


class Entry(Protocol):
    @property
    def shard(self) -> int: ...
    @property
    def rank(self) -> int: ...


E = TypeVar("E", bound=Entry)
_GONE: Any = None  # a delta value: the base's entry was removed
_MISSING: Any = object()


def _compact_at(base: int) -> int:
    """Delta size (entries and ranks) past which a build folds it into a new base."""
    return max(64, 4 * math.isqrt(base))


class InFlightTable(Sequence[E]):
    """Immutable: entries in grant order, by shard, and each rank's shards in grant order.
    `_base` and `_base_ranks` are shared between versions; `_delta` maps a shard to its entry
    now (None: gone). A base shard whose entry was replaced keeps its place; one that left
    and came back is in `_moved`, after the base, in `_delta`'s order."""

    __slots__ = ("_base", "_base_ranks", "_count", "_delta", "_delta_ranks", "_items", "_moved")

    def __init__(self, entries: Iterable[E] = ()) -> None:
        base: dict[int, E] = {}
        ranks: dict[int, list[int]] = {}
        for entry in entries:
            if entry.shard in base:
                raise ValueError(f"shard {entry.shard} is in flight twice")
            base[entry.shard] = entry
            ranks.setdefault(entry.rank, []).append(entry.shard)
        self._base = base
        self._base_ranks = {rank: tuple(shards) for rank, shards in ranks.items()}
        self._delta: dict[int, E | None] = {}
        self._delta_ranks: dict[int, tuple[int, ...]] = {}
        self._moved: frozenset[int] = frozenset()
        self._count = len(base)
        self._items: tuple[E, ...] | None = None

    @classmethod
    def of(cls, entries: Iterable[E]) -> InFlightTable[E]:
        return entries if isinstance(entries, InFlightTable) else cls(entries)

    # -- reading -------------------------------------------------------------------------

    def get(self, shard: int) -> E | None:
        change = self._delta.get(shard, _MISSING)
        return self._base.get(shard) if change is _MISSING else change

    def shards_of(self, rank: int) -> tuple[int, ...]:
        """`rank`'s shards in flight, in grant order."""
        shards = self._delta_ranks.get(rank)
        return self._base_ranks.get(rank, ()) if shards is None else shards

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[E]:
        return iter(self.items())

    @overload
    def __getitem__(self, index: int) -> E: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[E, ...]: ...
    def __getitem__(self, index: int | slice) -> E | tuple[E, ...]:
        return self.items()[index]

    def items(self) -> tuple[E, ...]:
        """The entries as a tuple, built once per version (serialising, listing, checks)."""
        if self._items is None:
            self._items = tuple(self._merged().values() if self._delta else self._base.values())
        return self._items

    def _merged(self) -> dict[int, E]:
        """The base with the delta applied, as a dict would have it: a C-level copy of
        the base, then one step per change."""
        merged = self._base.copy()
        moved = self._moved
        for shard, change in self._delta.items():
            if change is None:
                merged.pop(shard, None)
            else:
                if shard in moved:
                    merged.pop(shard, None)  # granted again: last
                merged[shard] = change
        return merged

    def __eq__(self, other: object) -> bool:
        if isinstance(other, InFlightTable):
            return other is self or self.items() == other.items()
        if isinstance(other, tuple):
            return self.items() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.items())

    def __repr__(self) -> str:
        return f"InFlightTable({list(self.items())!r})"

    def edit(self) -> InFlightEdit[E]:
        return InFlightEdit(self)

    # -- building ------------------------------------------------------------------------

    def _with(
        self,
        changes: dict[int, E | None],
        added: set[int],
        ranks: dict[int, list[int]],
        count: int,
    ) -> InFlightTable[E]:
        delta = self._delta.copy()
        moved = self._moved
        for shard, change in changes.items():
            if shard in added:  # granted (again): it goes last, as in a dict
                delta.pop(shard, None)
                if shard in self._base:
                    moved = moved | {shard}
            delta[shard] = change
        delta_ranks = self._delta_ranks.copy()
        for rank, shards in ranks.items():
            delta_ranks[rank] = tuple(shards)
        built = InFlightTable.__new__(InFlightTable)
        built._base, built._base_ranks = self._base, self._base_ranks
        built._delta, built._delta_ranks, built._moved = delta, delta_ranks, moved
        built._count, built._items = count, None
        if len(delta) + len(delta_ranks) > _compact_at(len(self._base)):
            built._fold()
        return built

    def _fold(self) -> None:
        """Make the delta part of a new base (this object's own: nobody shares it yet)."""
        base = self._merged()
        ranks = self._base_ranks.copy()
        for rank, shards in self._delta_ranks.items():
            if shards:
                ranks[rank] = shards
            else:
                ranks.pop(rank, None)
        self._base, self._base_ranks = base, ranks
        self._delta, self._delta_ranks, self._moved = {}, {}, frozenset()


class InFlightEdit(Generic[E]):
    """One operation's changes to an InFlightTable: a mutable mapping shard -> entry (an
    entry's rank never changes while it is in flight), with each rank's shards. `build()`
    makes the next InFlightTable; the edit cannot change after that."""

    __slots__ = ("_added", "_built", "_changes", "_count", "_of", "_ranks")

    def __init__(self, of: InFlightTable[E]) -> None:
        self._of = of
        self._changes: dict[int, E | None] = {}
        self._added: set[int] = set()  # shards this edit granted (not only replaced)
        self._ranks: dict[int, list[int]] = {}  # ranks whose shards this edit changed
        self._count = len(of)
        self._built = False

    def get(self, shard: int) -> E | None:
        change = self._changes.get(shard, _MISSING)
        return self._of.get(shard) if change is _MISSING else change

    def __contains__(self, shard: int) -> bool:
        return self.get(shard) is not None

    def __getitem__(self, shard: int) -> E:
        entry = self.get(shard)
        if entry is None:
            raise KeyError(shard)
        return entry

    def __setitem__(self, shard: int, entry: E) -> None:
        self._check_open()
        old = self.get(shard)
        if old is None:  # granted: last in grant order
            self._count += 1
            self._shards(entry.rank).append(shard)
            self._added.add(shard)
            self._changes.pop(shard, None)
        elif old.rank != entry.rank:
            raise ValueError(f"shard {shard} is held by rank {old.rank}, not {entry.rank}")
        self._changes[shard] = entry

    def __delitem__(self, shard: int) -> None:
        self._check_open()
        old = self[shard]
        self._changes[shard] = _GONE
        self._count -= 1
        self._shards(old.rank).remove(shard)

    def __len__(self) -> int:
        return self._count

    def shards_of(self, rank: int) -> Sequence[int]:
        """`rank`'s shards in flight, in grant order."""
        mine = self._ranks.get(rank)
        return self._of.shards_of(rank) if mine is None else mine

    def build(self) -> InFlightTable[E]:
        """The next InFlightTable; the edit is closed (changing it raises TypeError)."""
        self._built = True
        if not self._changes:
            return self._of
        return self._of._with(self._changes, self._added, self._ranks, self._count)

    def _shards(self, rank: int) -> list[int]:
        mine = self._ranks.get(rank)
        if mine is None:
            mine = self._ranks[rank] = list(self._of.shards_of(rank))
        return mine

    def _check_open(self) -> None:
        if self._built:
            raise TypeError("this edit was built into a state: it cannot change any more")
