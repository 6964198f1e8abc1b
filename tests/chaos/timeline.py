"""The soak's timeline picture: rank 0's steps over time above, and below one lane per
kind of fault, each fault a bar from its injection to its recovery (or its hold's end
where it never recovered), numbered as in the table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from antdt.testing.faults import FaultKind, FaultRecord, FaultState

#: One colour a lane; black is a failed fault's.
PALETTE = ("C0", "C1", "C2", "C3", "C4", "C6", "C9")


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

    kinds = [k for k in FaultKind if any(r.fault.kind is k for r in records)]
    fig, (top, lanes) = plt.subplots(
        2, 1, sharex=True, figsize=(11, 5.5), gridspec_kw={"height_ratios": [3, 1 + len(kinds) / 3]}
    )
    if steps:
        top.plot([t for t, _ in steps], [s for _, s in steps], ".", ms=2, color="black")
    top.set_ylabel("rank 0's step")
    top.set_title(f"{title} (a restart resumes from the last checkpoint)")
    for record in records:
        if record.injected_s is None:
            continue
        lane = kinds.index(record.fault.kind)
        end = record.recovered_s or record.injected_s + record.fault.hold_s
        colour = "black" if record.state is FaultState.FAILED else PALETTE[lane]
        lanes.broken_barh(
            [(record.injected_s, end - record.injected_s)], (lane - 0.4, 0.8), color=colour
        )
        lanes.text(record.injected_s, lane, str(record.fault.number), fontsize=7, va="center")
        top.axvline(record.injected_s, color=PALETTE[lane], alpha=0.4, lw=0.8)
    lanes.set_yticks(range(len(kinds)), [k.value for k in kinds], fontsize=8)
    lanes.set_ylim(-0.6, len(kinds) - 0.4)
    lanes.set_xlabel(
        "seconds from the job's first step (bar: injected to recovered; black: failed)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
