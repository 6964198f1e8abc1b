"""Process-wide settings of a service process (runtime/process.py): the collector's
thresholds, from the settings, applied once at start."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from antdt.runtime.config import ServiceSettings
from antdt.runtime.process import SERVICE_GC_THRESHOLDS, configure_gc


@pytest.fixture
def gc_state() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_thresholds_come_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServiceSettings().gc_thresholds == SERVICE_GC_THRESHOLDS
    monkeypatch.setenv("ANTDT_GC_THRESHOLDS", "[700, 10, 10]")
    assert ServiceSettings().gc_thresholds == (700, 10, 10)
    monkeypatch.setenv("ANTDT_GC_THRESHOLDS", "null")
    assert ServiceSettings().gc_thresholds is None
    for bad in ("[0, 10, 10]", "[700, 10]", "fast"):
        monkeypatch.setenv("ANTDT_GC_THRESHOLDS", bad)
        with pytest.raises(ValidationError, match="gc_thresholds"):
            ServiceSettings()


def test_configure_gc_sets_the_thresholds_and_freezes_what_start_up_made(
    gc_state: None,
) -> None:
    configure_gc((12_345, 7, 9))
    assert gc.get_threshold() == (12_345, 7, 9)
    assert gc.get_freeze_count() > 0


def test_none_leaves_the_collector_alone(gc_state: None) -> None:
    gc.set_threshold(701, 11, 12)
    configure_gc(None)
    assert gc.get_threshold() == (701, 11, 12)
    assert gc.get_freeze_count() == 0
