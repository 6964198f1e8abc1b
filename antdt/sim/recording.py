"""A run's recorded step events as a file: one StepEvent per line (JSON), in the order
recorded, gzip-compressed when the name ends in `.gz`. What `antdt sim --from-steps`
replays; `antdt demo` writes one per run."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, TextIO

from antdt.schemas import StepEvent


def save_steps(path: Path, events: Iterable[StepEvent]) -> Path:
    """Write `events` to `path`, one JSON line each; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _open(path, "wt") as f:
        for event in events:
            f.write(event.model_dump_json())
            f.write("\n")
    return path


def load_steps(path: Path) -> list[StepEvent]:
    """The step events of a file `save_steps` wrote; ValueError naming the first bad line,
    or saying the file is cut short or not readable as gzip or UTF-8 text."""
    events: list[StepEvent] = []
    try:
        with _open(path, "rt") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    events.append(_event(path, number, line))
    except (EOFError, zlib.error, UnicodeDecodeError) as exc:
        read = f"after {len(events)} events" if events else "before any event"
        raise ValueError(f"{path}: unreadable {read} ({type(exc).__name__}: {exc})") from None
    return events


def _event(path: Path, number: int, line: str) -> StepEvent:
    try:
        return StepEvent.model_validate_json(line)
    except ValueError as exc:
        raise ValueError(f"{path}:{number}: not a step event ({exc})") from None


def _open(path: Path, mode: Literal["rt", "wt"]) -> TextIO:
    if path.suffix == ".gz":
        return gzip.open(path, mode, encoding="utf-8")
    return path.open(mode, encoding="utf-8")


__all__ = ["load_steps", "save_steps"]
