"""The bench as a picture (runs/bench/bench.png), next to its table: shards fetch+done
cycles/s by client count against the raw NATS request/reply ceiling and an in-memory
master (no durability) of the same run, and the targets; and every row that has a
same-run baseline as its ratio to it (and the scenario's ceiling where a row has one)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

#: Where the ratio axis is labelled (those within the drawn rows' range).
RATIO_TICKS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)


def series_of(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float, float]]]:
    """(clients, value, p50 ms) per series, by client count."""
    found: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for row in rows:
        if "series" in row:
            found[row["series"]].append((row["clients"], row["value"], row.get("p50_ms") or 0.0))
    return {name: sorted(points) for name, points in found.items()}


def draw(rows: list[dict[str, Any]]) -> Figure:
    series = series_of(rows)
    if not series:
        raise ValueError("no shards or raw NATS rows to draw")
    fig = Figure(figsize=(13.0, 5.0), layout="constrained")
    FigureCanvasAgg(fig)  # Agg, no pyplot: no global state, no display
    cycles, ratios = fig.subplots(1, 2, gridspec_kw={"width_ratios": (1.0, 1.3)})
    measured = 0  # series of the shards service drawn so far
    for name, points in series.items():
        clients = [c for c, _, _ in points]
        values = [v for _, v, _ in points]
        raw = name.startswith("raw")
        baseline = raw or name.startswith(("in-memory", "DLRover"))
        # The re-implemented masters' figures are in the table: labelling them too
        # crowded the one-client points past reading.
        labelled = not raw and not name.startswith("in-memory")
        [line] = cycles.plot(
            clients,
            values,
            marker="o",
            ls="--" if baseline else "-",
            label=name,
            color="grey" if raw else None,
        )
        # Baselines are labelled left of their points, the service's series right: one
        # above its points, the next below, so that nothing overlaps at 8 clients.
        offset = (-6, 6) if baseline else (6, 6 if measured % 2 == 0 else -12)
        for c, v, p50 in points:
            if labelled:
                cycles.annotate(
                    f"{v:,.0f}/s, p50 {p50:.1f} ms",
                    (c, v),
                    fontsize=7,
                    color=line.get_color(),
                    textcoords="offset points",
                    xytext=offset,
                    ha="right" if baseline else "left",
                )
        measured += not baseline
    # The targets as set, and scaled to this run's DLRover master, as the rows say.
    scaled_label = "the target scaled to this run's DLRover"
    for key, marker, label in (
        ("cycle_target", "x", "the issue's target"),
        ("scaled_target", "+", scaled_label),
    ):
        targets = [(r["clients"], r[key]) for r in rows if key in r]
        if targets:
            cycles.scatter(
                [c for c, _ in targets],
                [v for _, v in targets],
                marker=marker,
                s=80,
                color="red",
                zorder=3,
                label=label,
            )
    cycles.set_xscale("log", base=2)
    drawn = sorted({c for points in series.values() for c, _, _ in points})
    cycles.set_xticks(drawn, labels=[str(c) for c in drawn])
    cycles.set_xlim(0.3, max(drawn) * 2.5)  # room left of 1 for the baselines' labels
    cycles.set_xlabel("concurrent clients")
    cycles.set_ylabel("per second")
    cycles.set_ylim(bottom=0)
    cycles.set_title(
        "shards fetch+done cycles vs DLRover's own master, in-memory masters\n"
        "and the bare transport",
        fontsize=10,
    )
    cycles.legend(fontsize=8, frameon=False, loc="upper left")
    _ratios(ratios, rows)
    fig.suptitle(
        "make bench (figures of one run; ratios are against same-run baselines)", fontsize=11
    )
    return fig


def _ratios(ax: Any, rows: list[dict[str, Any]]) -> None:
    with_baseline = [row for row in rows if row.get("baseline")]
    # A row measured in turns with its baseline says its ratio (the median turn's).
    pairs = [
        (row["what"], row.get("ratio", row["value"] / row["baseline"])) for row in with_baseline
    ]
    # Some rows are rates (higher is better), some latencies or costs: each says its target.
    labels = [
        f"{_short(r['what'])}\ntarget: {_short(str(r.get('target', '')))}" for r in with_baseline
    ]
    ax.barh(range(len(pairs)), [ratio for _, ratio in pairs], color="tab:blue")
    # A row that knows the best ratio its scenario allows (its ceiling) marks it across
    # its bar, and says it beside its ratio.
    ceilings = {i: r["ceiling"] for i, r in enumerate(with_baseline) if r.get("ceiling")}
    if ceilings:
        ax.vlines(
            list(ceilings.values()),
            [i - 0.45 for i in ceilings],
            [i + 0.45 for i in ceilings],
            color="red",
            lw=1.5,
            zorder=3,
            label="the scenario's ceiling",
        )
        ax.legend(fontsize=7, frameon=False, loc="lower right")
    ax.set_yticks(range(len(pairs)), labels=labels, fontsize=6.5)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xscale("log")
    # Labelled round ratios only: the log axis's own minor labels overlap once the
    # ratios span two decades (a write budget row sits at 0.15, a latency row at 7).
    ratios = [ratio for _, ratio in pairs] + list(ceilings.values()) or [1.0]
    low, high = min(ratios) / 1.5, max(ratios) * 1.5
    ticks = [t for t in RATIO_TICKS if low <= t <= high] or [1.0]
    ax.set_xticks(ticks, labels=[f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("value / same-run baseline (log)")
    ax.set_title("every row with a baseline", fontsize=10)
    for i, (_, ratio) in enumerate(pairs):
        said = f"{ratio:.2f} (ceiling {ceilings[i]:.2f})" if i in ceilings else f"{ratio:.2f}"
        ax.annotate(
            said,
            (max(ratio, ceilings.get(i, 0.0)), i),
            fontsize=7,
            va="center",
            textcoords="offset points",
            xytext=(3, 0),
        )


def _short(what: str, width: int = 60) -> str:
    return what if len(what) <= width else what[: width - 1] + "…"


def save_chart(rows: list[dict[str, Any]], path: Path) -> Path:
    draw(rows).savefig(path, format="png", dpi=110)
    return path
