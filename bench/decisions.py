"""One policy decision at 100, 1,000 and 10,000 ranks: the cost a controller pays per
health tick or incident. The view is a job with one persistent 3x compute straggler (and,
for `links`, one persistent slow link), every rank with a fitted step-time model, its
health already read into columns (as the controller does once per health message; that
cost is timed apart, `columns_ms`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from antdt.schemas import (
    Cause,
    Incident,
    IncidentKind,
    IncidentState,
    JobHealth,
    JobSpec,
    Plan,
    RankHealth,
    RankState,
    StragglerClass,
)
from antdt.services.controller.columns import HealthColumns
from antdt.services.controller.guardrails import Guardrails
from antdt.services.controller.policies import JobView, load_policy
from antdt.services.controller.policies.links import RestartCost, decide_link_move
from bench.cores import service_gc

JOB = "bench-decide"
LOCAL_BATCH = 32
RANK_COUNTS = (100, 1_000, 10_000)
POLICIES = ("none", "lb-bsp", "antdt-nd", "antdt-dd", "links")
TARGET_MS = 10.0


def _incident(rank: int, cause: Cause, evidence: dict[str, float], ratio: float = 3.0) -> Incident:
    return Incident(
        id=f"{JOB}-{rank}-{cause.value}",
        job=JOB,
        rank=rank,
        host=f"h{rank}",
        kind=IncidentKind.SLOW,
        straggler_class=StragglerClass.PERSISTENT,
        cause=cause,
        state=IncidentState.ESCALATED,
        step=50,
        opened_at=10.0,
        updated_at=20.0,
        ratio=ratio,
        windows=4,
        evidence=evidence,
    )


#: The crowded view's share of ranks held slow: what a non-dedicated cluster of 10,000
#: ranks shows (`antdt sim examples/sim/non_dedicated.toml --ranks 10000`: 1,400-1,800
#: open incidents from the 100th step on).
CROWD = 0.15


def _slow_ranks(ranks: int, crowd: float) -> dict[int, float]:
    """The ranks held slow and their ratio: the last one at 3x; with a crowd, that share
    of the others too, spread evenly, at 1.5-4x, persistent."""
    slow = {ranks - 1: 3.0}
    crowded = (r for r in range(ranks - 1) if int((r + 1) * crowd) > int(r * crowd))
    slow.update({r: 1.5 + (r * 7 % 26) / 10 for r in crowded})
    return slow


def decision_view(
    ranks: int, *, link: bool = False, crowd: float = 0.0
) -> tuple[JobView, JobHealth]:
    """A job of `ranks` ranks, its last rank 3x slow in compute (and its first with a slow
    link when `link`), at step 200 of a long run, equal shares in force. `crowd`: that
    share of the ranks persistently slow as well (1.5-4x), each with its incident."""
    slow = _slow_ranks(ranks, crowd)
    spec = JobSpec(
        job=JOB,
        world_size=ranks,
        dataset_size=LOCAL_BATCH * ranks * 10_000,
        shard_size=LOCAL_BATCH,
        global_batch=LOCAL_BATCH * ranks,
        policy="antdt-nd",
    )
    rows = tuple(
        RankHealth(
            rank=r,
            host=f"h{r}",
            state=RankState.SLOW if r in slow else RankState.OK,
            last_step=200,
            local_batch=LOCAL_BATCH,
            samples_per_s=1000.0 / slow.get(r, 1.0) * (1 + (r % 7) * 1e-3),
            compute_s_per_sample=1e-3 * slow.get(r, 1.0),
            ratio=slow.get(r, 1.0),
            data_wait_share=0.0,
            comm_share=0.1,
            fixed_s=0.002,
            per_sample_s=1e-3 * slow.get(r, 1.0) * (1 + (r % 5) * 1e-3),
        )
        for r in range(ranks)
    )
    health = JobHealth(
        job=JOB,
        at=999.0,
        step=200,
        step_s=0.1,
        samples_per_s=LOCAL_BATCH * ranks / 0.1,
        balance_efficiency=0.4,
        plan_version=0,
        ranks=rows,
    )
    # The last rank's onset took the step from 40 to 100 ms; with a crowd slow, each
    # other onset took it from about what it is now.
    incidents = [
        _incident(r, Cause.COMPUTE, {"step_s_before": 0.04 if r == ranks - 1 else 0.098}, ratio)
        for r, ratio in sorted(slow.items())
    ]
    if link:
        incidents.append(
            _incident(0, Cause.COMMUNICATION, {"step_s_before": 0.04, "link_rtt_s": 0.05})
        )
    plan = Plan(
        job=JOB, version=0, local_batch=spec.equal_shares(), effective_step=0, created_at=0.0
    )
    view = JobView(
        spec=spec,
        plan=plan,
        health=health,
        open_incidents=tuple(incidents),
        memory_caps={},
        last_action_at=None,
        now=1000.0,
        hosts={r: f"h{r}" for r in range(ranks)},
        remaining_samples=spec.dataset_size - 201 * spec.global_batch,
        columns=HealthColumns.of(health, ranks),  # as the controller's job record does
    )
    return view, health


def decider(policy: str, ranks: int, crowd: float = 0.0) -> Callable[[], Any]:
    """One decision of `policy` on a view of `ranks` ranks, as a call: each call gets its
    own copy of the view (a view remembers what a decision derived from it)."""
    if policy == "links":
        view, health = decision_view(ranks, link=True, crowd=crowd)
        cost = RestartCost(30.0, False, 2.0)
        return lambda: decide_link_move(replace(view), health, Guardrails(), cost, lambda _: True)
    view, health = decision_view(ranks, crowd=crowd)
    chosen = load_policy(policy)
    return lambda: chosen.decide(replace(view), health)


def decision_ms(policy: str, ranks: int, *, repeats: int = 5, crowd: float = 0.0) -> float:
    """The median CPU time of one decision on this thread, ms (after one warm-up call):
    CPU time, as other processes on a shared machine stretch wall time; under the
    collector settings of a service process, as the controller decides."""
    call = decider(policy, ranks, crowd)
    samples = []
    with service_gc():
        call()
        for _ in range(repeats):
            started = time.thread_time()
            call()
            samples.append((time.thread_time() - started) * 1e3)
    return statistics.median(samples)


def columns_ms(ranks: int, *, repeats: int = 5) -> float:
    """The median CPU time of reading one health's rows into columns, ms: paid once per
    health message by the controller's job record, not by each decision on it."""
    _, health = decision_view(ranks)
    samples = []
    for _ in range(repeats):
        started = time.thread_time()
        HealthColumns.of(health, ranks)
        samples.append((time.thread_time() - started) * 1e3)
    return statistics.median(samples)


def decision_rows(repeats: int = 5) -> list[dict[str, Any]]:
    """One row per policy and rank count, each with its ratio to the same decision at
    the smallest rank count, and the once-per-health cost of the columns it reads."""
    reading = {ranks: columns_ms(ranks, repeats=repeats) for ranks in RANK_COUNTS}
    rows: list[dict[str, Any]] = []
    for crowd in (0.0, CROWD):
        for policy in POLICIES:
            ms = {n: decision_ms(policy, n, repeats=repeats, crowd=crowd) for n in RANK_COUNTS}
            base = ms[RANK_COUNTS[0]]
            rows += [
                {
                    "policy": policy,
                    "ranks": ranks,
                    "crowd": crowd,
                    "ms": ms[ranks],
                    "ratio": ms[ranks] / base,
                    "columns_ms": reading[ranks],
                }
                for ranks in RANK_COUNTS
            ]
    return rows


def _what(row: dict[str, Any]) -> str:
    crowded = f", {row['crowd']:.0%} of them slow" if row["crowd"] else ""
    return f"one {row['policy']} decision at {row['ranks']:,} ranks{crowded}, CPU µs"


def bench_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bench table's rows: each policy at the largest rank count, in µs, against the
    same decision at the smallest; a row over the target says so (`failed`)."""
    base = {(r["policy"], r["crowd"]): r["ms"] for r in rows if r["ranks"] == RANK_COUNTS[0]}
    out = []
    for row in rows:
        if row["ranks"] != RANK_COUNTS[-1]:
            continue
        kind = (row["policy"], row["crowd"])
        entry: dict[str, Any] = {
            "what": _what(row),
            "value": row["ms"] * 1e3,
            "baseline": base[kind] * 1e3 or None,
            "baseline_what": f"same at {RANK_COUNTS[0]} ranks",
            "target": f"< {TARGET_MS * 1e3:,.0f} µs",
            "details": [r for r in rows if (r["policy"], r["crowd"]) == kind],
        }
        if row["ms"] >= TARGET_MS:
            entry["failed"] = f"{entry['what']}: {row['ms']:.1f} ms >= {TARGET_MS:g} ms"
        out.append(entry)
    return out


def print_decisions(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from bench.display import console

    table = Table(title=f"One policy decision (median CPU ms; target < {TARGET_MS:g} ms at 10,000)")
    columns = (
        "policy",
        "ranks",
        "slow",
        "ms",
        "ratio to 100 ranks",
        "health to columns, once a tick",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in rows:
        table.add_row(
            row["policy"],
            f"{row['ranks']:,}",
            f"{row['crowd']:.0%}" if row["crowd"] else "one",
            f"{row['ms']:.3f}",
            f"{row['ratio']:.1f}",
            f"{row['columns_ms']:.3f}",
        )
    console.print(table)


if __name__ == "__main__":
    print_decisions(decision_rows())
