"""Process-wide settings of a service process, applied once at its start: the cyclic garbage
collector's thresholds, raised after freezing what start-up made, since a service's many
long-lived objects made full collections cost half its CPU. The agent leaves them alone:
it lives in the user's training process."""

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
