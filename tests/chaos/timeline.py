"""The soak's timeline picture: rank 0's steps over time, each fault a span from its
injection to its recovery (or undo), one colour per kind."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from antdt.testing.faults import FaultKind, FaultRecord


def draw(
    steps: Sequence[tuple[float, int]],
    records: Sequence[FaultRecord],
    path: Path,
    title: str,
) -> Path:
    """`steps`: (seconds from the soak's start, step) of rank 0; times of `records` on
    the same clock. Writes a PNG to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {kind: f"C{i}" for i, kind in enumerate(FaultKind)}
    fig, ax = plt.subplots(figsize=(11, 4.5))
    if steps:
        ax.plot([t for t, _ in steps], [s for _, s in steps], ".", ms=2, color="black")
    shown: set[FaultKind] = set()
    for record in records:
        if record.injected_s is None:
            continue
        kind = record.fault.kind
        end = record.recovered_s or record.injected_s + record.fault.hold_s
        ax.axvspan(
            record.injected_s,
            end,
            alpha=0.3,
            color=colours[kind],
            label=None if kind in shown else kind.value,
        )
        ax.text(record.injected_s, 0, f"{record.fault.number}", fontsize=7, va="bottom")
        shown.add(kind)
    ax.set_xlabel("seconds from the soak's start")
    ax.set_ylabel("rank 0's step (restarts resume from a checkpoint)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
