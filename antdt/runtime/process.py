"""Process-wide settings of a service process, applied once at its start.

Python's cyclic garbage collector. A service holds hundreds of thousands of long-lived
objects: a shards replica, each job's ledger and its in-flight entries, the indexes of
recent ledgers, snapshots; a monitor, every rank's windows. None of them form reference
cycles, yet every collection of the oldest generation traverses all of them, and
Python's default thresholds (700, 10, 10) run one every few hundred thousand
allocations. Measured on a 10^4-rank checkpoint (`make bench`): the replica spent about
half its CPU in the collector, 2.8-3.3 ms per commit against 1.4-1.8 ms with the
thresholds below. The agent does not touch them: it lives in the user's training process.
"""

from __future__ import annotations

import gc

import structlog

log = structlog.get_logger("antdt.process")

#: Allocations (net of frees) between young collections; young collections per middle
#: one; middle collections per full one (Python also waits for the long-lived objects to
#: have grown by a quarter since the last full one).
SERVICE_GC_THRESHOLDS = (50_000, 20, 100)


def configure_gc(thresholds: tuple[int, int, int] | None) -> None:
    """Set the collector's thresholds (None: leave Python's own), and move what start-up
    made (modules, classes, settings) out of the collector's sight for good."""
    if thresholds is None:
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
    log.debug("gc thresholds set", thresholds=thresholds, frozen=gc.get_freeze_count())
