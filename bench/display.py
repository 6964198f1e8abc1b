"""How the bench shows its figures: one console for every part, and the table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

console = Console(width=160)


def listed(ratios: list[float]) -> str:
    return ", ".join(f"{r:.2f}" for r in ratios)


def print_table(rows: list[dict[str, Any]]) -> None:
    table = Table(title="AntDT bench (ratios are against the same-run baseline)")
    for column in ("what", "value", "baseline", "ratio", "ceiling", "p50/p99 ms", "target"):
        table.add_column(column, justify="left" if column in ("what", "target") else "right")
    for row in rows:
        latency = f"{row['p50_ms']:.2f}/{row['p99_ms']:.2f}" if "p50_ms" in row else ""
        baseline = row["baseline"]
        table.add_row(
            row["what"],
            f"{row['value']:,.0f}",
            f"{baseline:,.0f} ({row['baseline_what']})" if baseline else "",
            f"{row.get('ratio', row['value'] / (baseline or 1)):.2f}" if baseline else "",
            _ceiling(row),
            latency,
            row["target"],
        )
    console.print(table)


def _ceiling(row: dict[str, Any]) -> str:
    """The best ratio the row's scenario allows, where it has one."""
    if not row.get("ceiling"):
        return ""
    late = row.get("ceiling_late")
    return f"{row['ceiling']:.2f}" + (f" ({late:.2f} one step late)" if late else "")
