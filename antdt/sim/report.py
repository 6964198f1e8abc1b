"""A simulation's figures: every policy next to `none` and the oracle of the same run,
as a rich table, JSON and (matplotlib installed) a PNG.

job time T; throughput kept = T_healthy / T (the same samples on the cluster without
slowdowns); balance efficiency = the oracle's compute / the policy's slowest compute,
step by step, averaged; slowdown recovered = (T_none - T) / (T_none - T_oracle);
vs oracle = T_oracle / T."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from antdt.sim.files import ScenarioFile
from antdt.sim.run import RunResult

if TYPE_CHECKING:
    from antdt.sim.replay import Replay


@dataclass(frozen=True)
class Figures:
    policy: str
    job_s: float
    throughput_kept: float
    balance_efficiency: float
    adjusts: int
    restarts: int
    speedup_vs_none: float
    vs_oracle: float
    recovered: float | None  # None: `none` lost nothing to recover


def figures(runs: Sequence[RunResult], oracle: RunResult, healthy: RunResult) -> list[Figures]:
    """One row per run, then the oracle's; `runs` must include `none`."""
    by_name = {r.policy: r for r in runs}
    t_none = by_name["none"].job_s
    lost = t_none - oracle.job_s
    rows = []
    for r in [*runs, oracle]:
        balance = np.divide(
            oracle.compute_s, r.compute_s, where=r.compute_s > 0, out=np.ones_like(r.compute_s)
        )
        rows.append(
            Figures(
                policy=r.policy,
                job_s=r.job_s,
                throughput_kept=healthy.job_s / r.job_s,
                balance_efficiency=float(np.minimum(balance, 1.0).mean()),
                adjusts=r.adjusts,
                restarts=r.restarts,
                speedup_vs_none=t_none / r.job_s,
                vs_oracle=oracle.job_s / r.job_s,
                recovered=(t_none - r.job_s) / lost if lost > 1e-9 * t_none else None,
            )
        )
    return rows


def table(scenario: ScenarioFile, rows: Sequence[Figures]) -> object:
    from rich.table import Table

    title = (
        f"{scenario.name}: {scenario.ranks:,} ranks x {scenario.steps:,} steps "
        f"(seed {scenario.seed})"
    )
    out = Table(title=title)
    for column in (
        "policy",
        "job time s",
        "x none",
        "vs oracle",
        "throughput kept",
        "balance eff.",
        "recovered",
        "adjusts",
        "restarts",
    ):
        out.add_column(column, justify="left" if column == "policy" else "right")
    for f in rows:
        out.add_row(
            f.policy,
            f"{f.job_s:,.1f}",
            f"{f.speedup_vs_none:.2f}",
            f"{f.vs_oracle:.2f}",
            f"{f.throughput_kept:.2f}",
            f"{f.balance_efficiency:.2f}",
            "-" if f.recovered is None else f"{f.recovered:.2f}",
            str(f.adjusts),
            str(f.restarts),
        )
    return out


def save_json(path: Path, scenario: ScenarioFile, rows: Sequence[Figures]) -> Path:
    body = {"scenario": scenario.model_dump(mode="json"), "figures": [vars(f) for f in rows]}
    path.write_text(json.dumps(body, indent=2))
    return path


def save_png(
    path: Path, scenario: ScenarioFile, runs: Sequence[RunResult], rows: Sequence[Figures]
) -> Path | None:
    """Step time over the run per policy (moving average) and the job times; None when
    matplotlib is not installed (the `sim` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, (steps_ax, bars_ax) = plt.subplots(
        1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2.2, 1]}
    )
    width = max(1, scenario.steps // 100)
    kernel = np.ones(width) / width
    for run in runs:
        smooth = np.convolve(run.step_s, kernel, mode="valid") * 1e3
        steps_ax.plot(np.arange(len(smooth)) + width // 2, smooth, label=run.policy, lw=1.2)
    steps_ax.set_xlabel("step")
    steps_ax.set_ylabel(f"step time, ms (mean of {width})")
    steps_ax.legend()
    steps_ax.set_title(f"{scenario.name}: {scenario.ranks:,} ranks")
    names = [f.policy for f in rows]
    bars_ax.barh(names, [f.job_s for f in rows], color="tab:blue")
    for i, f in enumerate(rows):
        note = "" if f.recovered is None else f" rec {f.recovered:.2f}"
        bars_ax.text(f.job_s, i, f" {f.job_s:,.0f}s{note}", va="center", fontsize=8)
    bars_ax.set_xlabel("job time, s (restarts included)")
    bars_ax.invert_yaxis()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def replay_table(result: Replay) -> object:
    """The recorded run next to each policy's replay of it."""
    from rich.table import Table

    sc = result.scenario
    out = Table(title=f"{sc.name}: {sc.ranks:,} ranks x {sc.steps:,} recorded steps")
    for column in ("run", "time s", "throughput kept", "vs recorded", "adjusts", "restarts"):
        out.add_column(column, justify="left" if column == "run" else "right")
    out.add_row("recorded", f"{result.measured_s:,.1f}", f"{result.measured_kept:.2f}", "1.00")
    for run in result.runs:
        out.add_row(
            f"replay {run.policy}",
            f"{run.job_s:,.1f}",
            f"{result.kept(run.policy):.2f}",
            f"{result.measured_s / run.job_s:.2f}",
            str(run.adjusts),
            str(run.restarts),
        )
    return out


def replay_json(path: Path, result: Replay) -> Path:
    body = {
        "scenario": result.scenario.model_dump(mode="json"),
        "recorded": {"time_s": result.measured_s, "throughput_kept": result.measured_kept},
        "healthy_s": result.healthy_s,
        "replays": [
            {
                "policy": r.policy,
                "time_s": r.job_s,
                "throughput_kept": result.kept(r.policy),
                "adjusts": r.adjusts,
                "restarts": r.restarts,
            }
            for r in result.runs
        ],
    }
    path.write_text(json.dumps(body, indent=2))
    return path
