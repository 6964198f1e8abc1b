"""Turns a demo run's per-step progress into the figures the table and JSON show."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from antdt.schemas import ActionRecord, ActionResult, JobHealth

WARMUP_STEPS = 10  # the first steps pay for imports, connections and allocator warm-up
SETTLE_STEPS = 30  # after onset: detection (2 windows) + decision + effective step


@dataclass
class RunStats:
    policy: str
    job: str
    steps: int
    pre_onset_samples_per_s: float
    after_onset_samples_per_s: float
    kept_share: float
    after_onset_all_samples_per_s: float
    efficiency_pre: float
    efficiency_after: float
    #: How the straggler was slowed: real work in its CPU budget, or (fallback) a sleep.
    injection: str = ""
    #: The share of pre-onset throughput a batch policy could keep were all of the slow
    #: rank's step work proportional to its batch (its optimizer step is not).
    ceiling_share: float = 0.0
    actions: list[dict[str, Any]] = field(default_factory=list)
    accuracy: float = 0.0
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def throughput(progress: list[dict[str, Any]], first: int, last: int) -> float:
    """Samples per second over steps (first, last], timed at rank 0's step ends."""
    rows = [p for p in progress if first <= p["step"] <= last]
    if len(rows) < 2:
        return 0.0
    elapsed = rows[-1]["t"] - rows[0]["t"]
    return sum(p["samples"] for p in rows[1:]) / elapsed if elapsed > 0 else 0.0


def mean_efficiency(health: list[JobHealth], first: int, last: int) -> float:
    values = [h.balance_efficiency for h in health if first <= h.step <= last and h.ranks]
    return sum(values) / len(values) if values else float("nan")


def summarize(
    *,
    policy: str,
    job: str,
    progress: list[dict[str, Any]],
    result: dict[str, Any],
    health: list[JobHealth],
    actions: list[ActionRecord],
    onset: int,
    wall_s: float,
    injection: str = "",
    ceiling_share: float = 0.0,
) -> RunStats:
    end = progress[-1]["step"]
    pre = throughput(progress, WARMUP_STEPS, onset - 1)
    after = throughput(progress, onset + SETTLE_STEPS, end)
    return RunStats(
        policy=policy,
        job=job,
        steps=len(progress),
        pre_onset_samples_per_s=round(pre, 1),
        after_onset_samples_per_s=round(after, 1),
        kept_share=round(after / pre, 3) if pre else 0.0,
        after_onset_all_samples_per_s=round(throughput(progress, onset, end), 1),
        efficiency_pre=round(mean_efficiency(health, WARMUP_STEPS, onset - 1), 3),
        efficiency_after=round(mean_efficiency(health, onset + SETTLE_STEPS, end), 3),
        injection=injection,
        ceiling_share=round(ceiling_share, 3),
        actions=[
            {
                "action_id": a.action_id,
                "local_batch": list(a.local_batch or ()),
                "effective_step": a.effective_step,
                "result": a.result.value,
                "reason": a.reason,
            }
            for a in actions
            if a.result == ActionResult.APPLIED
        ],
        accuracy=round(float(result["accuracy"]), 4),
        wall_s=round(wall_s, 1),
    )


def write_table(console: Console, runs: list[RunStats]) -> None:
    table = Table(title="AntDT demo: one rank 3x slower from step 30")
    table.add_column("policy")
    table.add_column("samples/s before onset", justify="right")
    table.add_column(f"samples/s after onset (+{SETTLE_STEPS} steps)", justify="right")
    table.add_column("share kept", justify="right")
    table.add_column("efficiency before / after", justify="right")
    table.add_column("actions", justify="right")
    table.add_column("test accuracy", justify="right")
    for run in runs:
        table.add_row(
            run.policy,
            f"{run.pre_onset_samples_per_s:,.0f}",
            f"{run.after_onset_samples_per_s:,.0f}",
            f"{run.kept_share:.2f}",
            f"{run.efficiency_pre:.2f} / {run.efficiency_after:.2f}",
            str(len(run.actions)),
            f"{run.accuracy:.3f}",
        )
    console.print(table)
    if len(runs) == 2 and runs[0].after_onset_samples_per_s > 0:
        gain = runs[1].after_onset_samples_per_s / runs[0].after_onset_samples_per_s
        console.print(
            f"after onset, [bold]{runs[1].policy}[/] runs {gain:.2f}x the throughput of "
            f"[bold]{runs[0].policy}[/] and keeps {runs[1].kept_share:.0%} of pre-onset throughput"
            f" (ceiling {runs[1].ceiling_share:.0%} were every part of the slow rank's step"
            f" to scale with its batch, which its optimizer step and its share of the "
            f"all-reduce do not; slowed by {runs[1].injection})"
        )
    for run in runs:
        for action in run.actions:
            console.print(
                f"  {run.policy}: plan {action['local_batch']} from step "
                f"{action['effective_step']} ({action['reason']})"
            )
