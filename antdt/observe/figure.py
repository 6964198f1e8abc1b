"""Draws a Timeline with matplotlib (an Agg canvas: no pyplot, no display): per-rank busy
time and per-sample time over steps, per-rank local batch, balance efficiency; incidents
and actions as labelled vertical markers on every panel. Returns PNG bytes and SVG text
(text kept as <text>, so the HTML report is searchable)."""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from antdt.observe.timeline import Marker, RankSeries, Timeline, robust_top

PANEL_HEIGHTS = (3.0, 2.0, 1.4, 1.4)
MAX_LABELS = 24  # marker labels drawn; beyond this only the lines (the tables list all)


def draw(timeline: Timeline, *, width_in: float = 13.0) -> Figure:
    fig = Figure(figsize=(width_in, sum(PANEL_HEIGHTS) + 1.6), layout="constrained")
    FigureCanvasAgg(fig)  # Agg, no pyplot: no global state, no display
    axes = fig.subplots(
        len(PANEL_HEIGHTS), 1, sharex=True, gridspec_kw={"height_ratios": PANEL_HEIGHTS}
    )
    busy, per_sample, batch, eff = axes
    for series in timeline.ranks:
        _rank_lines(series, busy, per_sample, batch)
    if timeline.step_wall:
        steps, walls = zip(*timeline.step_wall, strict=True)
        busy.plot(steps, walls, color="black", lw=1.0, ls="--", label="step wall time")
    _efficiency(eff, timeline)
    for ax in axes:
        _markers(ax, timeline.markers, labels=ax is busy)
    busy.set_ylabel("busy before barrier, s\n(compute + data wait)")
    per_sample.set_ylabel("compute per sample, ms")
    batch.set_ylabel("local batch")
    eff.set_xlabel("step")
    _clip(busy, [v for s in timeline.ranks for v in s.busy_s] + [w for _, w in timeline.step_wall])
    _clip(per_sample, [v for s in timeline.ranks for v in s.per_sample_ms])
    busy.legend(
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0),
        fontsize=8,
        frameon=False,
        ncol=min(7, len(timeline.ranks) + 1),
    )
    fig.suptitle(_title(timeline), fontsize=11)
    return fig


def _clip(ax: Any, values: list[float]) -> None:
    """Keep one outlier from squashing a panel; say how many points lie above."""
    top = robust_top(values)
    if top is None:
        return
    ax.set_ylim(bottom=0, top=top)
    above = sum(1 for v in values if v > top)
    ax.set_title(f"{above} point(s) above {top:.3g} not shown", loc="right", fontsize=7)


def _title(timeline: Timeline) -> str:
    s = timeline.summary
    return (
        f"AntDT run {timeline.job}: {s.get('ranks', '?')} ranks, steps {s.get('steps', '?')}, "
        f"median efficiency {s.get('median efficiency', 'n/a')}, "
        f"{s.get('incidents', '0')} incident(s), actions {s.get('actions applied / recorded')}"
    )


def _rank_lines(series: RankSeries, busy: Any, per_sample: Any, batch: Any) -> None:
    style = {"color": series.color, "lw": 1.2, "label": series.label}
    busy.plot(series.steps, series.busy_s, **style)
    points = [
        (s, v) for s, v in zip(series.steps, series.per_sample_ms, strict=True) if not math.isnan(v)
    ]
    if points:
        xs, ys = zip(*points, strict=True)
        per_sample.plot(xs, ys, color=series.color, lw=1.0)
    batch.step(series.steps, series.local_batch, where="post", color=series.color, lw=1.2)


def _efficiency(ax: Any, timeline: Timeline) -> None:
    ax.set_ylabel("balance\nefficiency")
    ax.set_ylim(0, 1.05)
    if timeline.efficiency:
        steps, values = zip(*timeline.efficiency, strict=True)
        ax.plot(steps, values, color="#1f77b4", lw=1.4, marker=".", ms=3)
    ax.axhline(1.0, color="#bbbbbb", lw=0.8)


def _markers(ax: Any, markers: tuple[Marker, ...], *, labels: bool) -> None:
    for i, m in enumerate(markers):
        is_action = m.kind == "action"
        ax.axvline(
            m.step,
            color=m.color,
            lw=2.0 if is_action else 1.2,
            ls="-" if is_action else "--",
            antialiased=False,  # exact colour: a reader (or test) can find the marker
            zorder=5 if is_action else 4,
        )
        if labels and i < MAX_LABELS:
            ax.annotate(
                m.label,
                xy=(m.step, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -4),
                textcoords="offset points",
                rotation=90,
                va="top",
                ha="left",
                fontsize=7,
                color=m.color,
                bbox={"facecolor": "white", "alpha": 0.75, "edgecolor": "none", "pad": 1},
                gid=f"marker-{m.kind}-{m.ref}",
            )


def png_bytes(fig: Figure, *, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def svg_text(fig: Figure) -> str:
    """SVG with text as <text> elements (searchable, selectable), without the XML prolog
    (it is embedded in HTML)."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "antdt"}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg") :]
