"""Straggler injection for tests and demos: a parsed schedule of slowdowns. Pure.
`ANTDT_INJECT`: entries split by ';', each `key=value` pairs split by ','; keys `rank`
or `host` (exactly one), `factor` (>= 1), `from` (default 0), `until` (default never).
Example: `rank=3,factor=3,from=30;host=slot1,factor=2,until=50`."""

from __future__ import annotations

import math
from dataclasses import dataclass

_KEYS = {"rank", "host", "factor", "from", "until"}


@dataclass(frozen=True)
class Injection:
    """One slowdown: `factor` x compute time for `rank` (or every rank on `host`)."""

    factor: float
    rank: int | None = None
    host: str | None = None
    start: int = 0
    until: int | None = None

    def applies(self, rank: int, host: str, step: int) -> bool:
        if self.rank is not None and self.rank != rank:
            return False
        if self.host is not None and self.host != host:
            return False
        return self.start <= step and (self.until is None or step < self.until)


def _int(key: str, value: str, entry: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"inject entry {entry!r}: {key}={value!r} is not an integer") from None
    if number < 0:
        raise ValueError(f"inject entry {entry!r}: {key} must be >= 0")
    return number


def _factor(value: str, entry: str) -> float:
    try:
        factor = float(value)
    except ValueError:
        raise ValueError(f"inject entry {entry!r}: factor={value!r} is not a number") from None
    if not math.isfinite(factor) or factor < 1.0:
        raise ValueError(f"inject entry {entry!r}: factor must be a finite number >= 1")
    return factor


def _pairs(entry: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in entry.split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not key or not value:
            raise ValueError(f"inject entry {entry!r}: {item.strip()!r} is not key=value")
        if key not in _KEYS:
            raise ValueError(f"inject entry {entry!r}: unknown key {key!r} (use {sorted(_KEYS)})")
        if key in pairs:
            raise ValueError(f"inject entry {entry!r}: {key} given twice")
        pairs[key] = value
    return pairs


def parse_entry(entry: str) -> Injection:
    pairs = _pairs(entry)
    if ("rank" in pairs) == ("host" in pairs):
        raise ValueError(f"inject entry {entry!r}: give exactly one of rank= or host=")
    if "factor" not in pairs:
        raise ValueError(f"inject entry {entry!r}: factor= is required")
    start = _int("from", pairs["from"], entry) if "from" in pairs else 0
    until = _int("until", pairs["until"], entry) if "until" in pairs else None
    if until is not None and until <= start:
        raise ValueError(f"inject entry {entry!r}: until ({until}) must be after from ({start})")
    return Injection(
        factor=_factor(pairs["factor"], entry),
        rank=_int("rank", pairs["rank"], entry) if "rank" in pairs else None,
        host=pairs.get("host"),
        start=start,
        until=until,
    )


@dataclass(frozen=True)
class InjectionSchedule:
    entries: tuple[Injection, ...] = ()

    @classmethod
    def parse(cls, text: str) -> InjectionSchedule:
        """Parse the grammar above; raises ValueError naming the bad entry."""
        entries = [e.strip() for e in text.split(";")]
        return cls(tuple(parse_entry(e) for e in entries if e))

    def for_rank(self, rank: int, host: str) -> InjectionSchedule:
        """Only the entries that can ever apply to this rank, so the per-step check is cheap."""
        return InjectionSchedule(tuple(e for e in self.entries if e.applies(rank, host, e.start)))

    def factor(self, rank: int, host: str, step: int) -> float:
        """The slowdown at `step` (1.0: none). Overlapping entries: the largest wins."""
        return max((e.factor for e in self.entries if e.applies(rank, host, step)), default=1.0)

    def extra_sleep(self, rank: int, host: str, step: int, compute_s: float) -> float:
        """Seconds to sleep so that this step's compute takes `factor` times as long."""
        return (self.factor(rank, host, step) - 1.0) * max(compute_s, 0.0)

    def __bool__(self) -> bool:
        return bool(self.entries)


def parse_inject(text: str) -> InjectionSchedule:
    return InjectionSchedule.parse(text)
