"""The detector's cost per step event, the monitor's health per rank, a receiver's
decoding of that health per rank and the shard ledger's per done-and-fetch, at 100,
1,000 and 10,000 ranks: none may grow with the job (the pure cores, no servers). A
health is O(ranks) by contract (each rank's figures, once a second per job); its cost
per rank must not grow, and its ms per call at 10,000 ranks is what a monitor replica
pays for such a job every second, and the controller again to read it."""

from __future__ import annotations

import json
import statistics
import time
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from pydantic import Field

from antdt.collector import collecting_every
from antdt.runtime.process import SERVICE_GC_THRESHOLDS
from antdt.schemas import (
    MAX_HEALTH_BYTES,
    JobHealth,
    JobSpec,
    RankHealth,
    ShardFetch,
    ShardRef,
    ShardReply,
    WireModel,
)
from antdt.schemas.base import Count, Timestamp, Token
from antdt.services.monitor.detector import JobDetector
from antdt.services.shards.ledger import new_ledger, plan_fetch
from antdt.testing import drawn_health

RANK_COUNTS = (100, 1_000, 10_000)
EVENTS = 200_000  # per rank count: 2,000 steps of 100 ranks, 20 of 10,000
OPS = 300  # done-and-fetch operations timed per rank count


def detector_us_per_event(ranks: int, events: int = EVENTS) -> float:
    """CPU µs per step event of a job with one 3x straggler (windows close and are judged
    as they fill; health, a 1 Hz O(ranks) call, is not counted)."""
    detector = JobDetector("bench", ranks)
    steps = max(3 * detector.config.window, events // ranks)
    slow, now, spent = ranks - 1, 0.0, 0.0
    for step in range(steps):
        now += 0.1
        rows = _step_rows(ranks, slow, step, now)
        started = time.thread_time()
        for fields in rows:
            detector.ingest_fields(fields, now)  # type: ignore[arg-type]
        spent += time.thread_time() - started
    return spent / (steps * ranks) * 1e6


def service_gc() -> AbstractContextManager[None]:
    """The cyclic garbage collector as a service process runs it (runtime/process.py),
    for the block. Python's default thresholds collect the whole heap often enough that
    at 10,000 ranks a health paid twice its own work in collections."""
    return collecting_every(SERVICE_GC_THRESHOLDS)


def health_us_per_rank(ranks: int, calls: int = 5) -> float:
    """CPU µs per rank of one health of a job with one 3x straggler, each after a step of
    every rank (its speed models refitted, as in a running job), past 3 windows: the
    median of `calls`, under the service's collector settings."""
    with service_gc():
        return _health_us_per_rank(ranks, calls)


def _health_us_per_rank(ranks: int, calls: int) -> float:
    detector = JobDetector("bench", ranks)
    slow, now, spent = ranks - 1, 0.0, []
    warm = 3 * detector.config.window
    for step in range(warm + calls):
        now += 0.1
        for fields in _step_rows(ranks, slow, step, now):
            detector.ingest_fields(fields, now)  # type: ignore[arg-type]
        if step >= warm:
            started = time.thread_time()
            detector.health(now)
            spent.append(time.thread_time() - started)
    return statistics.median(spent) / ranks * 1e6


def _step_rows(ranks: int, slow: int, step: int, now: float) -> list[tuple[Any, ...]]:
    """Every rank's step event fields for `step`, ended at `now` (0.1 s long)."""
    start = now - 0.1
    return [
        ("bench", r, f"h{r}", step, 0, 32, start, now, 32, _compute_s(r, slow, step), *FIGURES)
        for r in range(ranks)
    ]


#: A step event's data wait, communication and step seconds.
FIGURES = (0.001, 0.005, 0.1)


def _compute_s(rank: int, slow: int, step: int) -> float:
    straggling = rank == slow and step > 20
    return 0.032 * (3.0 if straggling else 1.0) * (1 + (rank * 7919 % 13) * 0.002)


class RowsHealth(WireModel):
    """JobHealth as a receiver validated it before 2026-12-01, a row object per rank:
    the baseline the columns are measured against, in the same run. The JobHealth of
    now still reads that form, converted to columns, at ~3x this."""

    max_message_bytes: ClassVar[int] = MAX_HEALTH_BYTES

    job: Token
    at: Timestamp
    step: Count
    step_s: float = Field(ge=0)
    samples_per_s: float = Field(ge=0)
    balance_efficiency: float = Field(ge=0, le=1)
    plan_version: Count
    ranks: tuple[RankHealth, ...]
    open_incidents: tuple[str, ...] = ()


def decode_us_per_rank(ranks: int, calls: int = 5, *, rows: bool = False) -> float:
    """CPU µs per rank for a receiver to validate one JobHealth's JSON (as the bus
    decodes it): its ranks as columns, or (`rows`) the same health as a row object per
    rank, validated as receivers did before 2026-12-01 (`RowsHealth`). The median of
    `calls`."""
    payload = _health_json(ranks, rows=rows)
    model: type[WireModel] = RowsHealth if rows else JobHealth
    spent = []
    for _ in range(calls):
        started = time.thread_time()
        model.model_validate_json(payload)
        spent.append(time.thread_time() - started)
    return statistics.median(spent) / ranks * 1e6


def _health_json(ranks: int, *, rows: bool) -> bytes:
    """A health of `ranks` measured ranks (`drawn_health`) as JSON: its ranks as
    columns, or as rows."""
    health = drawn_health("bench", ranks)
    if not rows:
        return health.model_dump_json().encode()
    wire = json.loads(health.model_dump_json())
    wire["ranks"] = [row.model_dump(mode="json") for row in health.ranks]
    return json.dumps(wire).encode()


def ledger_us_per_op(ranks: int, ops: int = OPS) -> float:
    """CPU µs of one done-and-fetch (a rank hands its shard back done and takes the
    next) on a ledger where every rank holds a shard."""
    spec = JobSpec(
        job="bench",
        world_size=ranks,
        dataset_size=ranks * 32 * 1000,
        shard_size=320,
        global_batch=32 * ranks,
    )
    state = new_ledger(spec)
    held = {}
    for rank in range(ranks):
        result = plan_fetch(state, ShardFetch(job="bench", rank=rank, epoch=0, want=1))
        state, held[rank] = result.state, _grant(result.reply)
    spent = 0.0
    for i in range(ops):
        rank = i % ranks
        shard, attempt = held[rank]
        done = (ShardRef(shard=shard, attempt=attempt, epoch=0),)
        request = ShardFetch(job="bench", rank=rank, epoch=0, want=1, done=done)
        started = time.thread_time()
        result = plan_fetch(state, request)
        spent += time.thread_time() - started
        state, held[rank] = result.state, _grant(result.reply)
    return spent / ops * 1e6


def _grant(reply: object) -> tuple[int, int]:
    assert isinstance(reply, ShardReply) and reply.grants, reply
    return reply.grants[0].shard, reply.grants[0].attempt


def core_rows() -> list[dict[str, Any]]:
    """One row per core and rank count, with the ratio to 100 ranks."""
    rows: list[dict[str, Any]] = []
    for core, measure in (
        ("detector, per event", detector_us_per_event),
        ("health, per rank of a call", health_us_per_rank),
        ("health decoded, per rank", decode_us_per_rank),
        ("ledger, per done+fetch", ledger_us_per_op),
    ):
        figures = {ranks: measure(ranks) for ranks in RANK_COUNTS}
        for ranks, us in figures.items():
            rows.append(
                {"core": core, "ranks": ranks, "us": us, "ratio": us / figures[RANK_COUNTS[0]]}
            )
    return rows


def print_cores(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from bench.display import console

    table = Table(title="Pure cores per operation (CPU µs; ratio to 100 ranks)")
    for column in ("core", "ranks", "µs", "ratio to 100 ranks"):
        table.add_column(column, justify="left" if column == "core" else "right")
    for row in rows:
        table.add_row(row["core"], f"{row['ranks']:,}", f"{row['us']:.1f}", f"{row['ratio']:.2f}")
    console.print(table)


def bench_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bench table's rows: each core at 10,000 ranks against itself at 100."""
    base = {r["core"]: r["us"] for r in rows if r["ranks"] == RANK_COUNTS[0]}
    return [
        {
            "what": f"{r['core']} at {r['ranks']:,} ranks, CPU µs x 1000",
            "value": r["us"] * 1e3,
            "baseline": base[r["core"]] * 1e3,
            "baseline_what": f"same at {RANK_COUNTS[0]} ranks",
            "target": "ratio <= 2 (independent of the ranks)",
        }
        for r in rows
        if r["ranks"] == RANK_COUNTS[-1]
    ]


def decode_row(ranks: int = RANK_COUNTS[-1]) -> dict[str, Any]:
    """A receiver's decoding of a health of `ranks` ranks as columns, against the same
    health as the row objects of earlier monitors, both measured here."""
    columns, rows = decode_us_per_rank(ranks), decode_us_per_rank(ranks, rows=True)
    row: dict[str, Any] = {
        "what": f"health of {ranks:,} ranks validated by a receiver, CPU ms",
        "value": columns * ranks / 1e3,
        "baseline": rows * ranks / 1e3,
        "baseline_what": "the same health as a row per rank (before 2026-12-01)",
        "target": "below the row form",
    }
    if columns >= rows:
        row["failed"] = f"columns {columns:.2f} µs a rank >= rows {rows:.2f}"
    return row


if __name__ == "__main__":
    print_cores(core_rows())
