"""The cyclic garbage collector's thresholds for a block of work. Pure Python, no
imports of the product: the simulator's runs and the bench's service-like measures
share it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: (allocations between young collections, young collections per middle one, middle
#: collections per full one): gc.set_threshold's three numbers.
Thresholds = tuple[int, int, int]


@contextmanager
def collecting_every(thresholds: Thresholds) -> Iterator[None]:
    """The collector at `thresholds` for the block, as it was after. Work that allocates
    millions of short-lived objects beside a large live state pays a full collection's
    walk of that state each time: fewer collections, nothing else changed."""
    before = gc.get_threshold()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*before)


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection for the block (reference counting frees as ever), the
    collector as it was after. For a bounded block that allocates millions of objects and
    makes next to no cycles: every young collection walks every object allocated since
    the last, which such a block pays for nothing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
