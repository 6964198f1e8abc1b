"""The self-contained HTML report (pure): the figure as inline SVG plus tables of the
run's summary, incidents and actions. No script, no external stylesheet, font or CDN."""

from __future__ import annotations

from html import escape

from antdt.observe.timeline import Timeline

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
tr.result-applied td.result { color: #d00000; font-weight: bold; }
tr.state-resolved td.state { color: #2e8b57; }
.figure svg { max-width: 100%; height: auto; }
.note { color: #8a5a00; }
"""


def render_html(timeline: Timeline, svg: str, *, png_name: str | None = None) -> str:
    title = f"AntDT report: {timeline.job}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        _notes(timeline.notes),
        _key_value_table("summary", timeline.summary),
        f'<div class="figure" id="figure">{svg}</div>',
        _legend(png_name),
        "<h2>Actions</h2>",
        _rows_table("actions", timeline.action_rows, row_id="action", row_class="result"),
        "<h2>Incidents</h2>",
        _rows_table("incidents", timeline.incident_rows, row_id="incident", row_class="state"),
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


def _notes(notes: tuple[str, ...]) -> str:
    return "".join(f'<p class="note">{escape(n)}</p>' for n in notes)


def _legend(png_name: str | None) -> str:
    text = (
        "Vertical markers: red solid = an applied action (at its effective step), grey "
        "solid = an action refused, failed or partial, orange dashed = an incident opened "
        "or escalated, green dashed = resolved."
    )
    if png_name:
        text += f" The same picture as PNG: {escape(png_name)}."
    return f"<p>{text}</p>"


def _key_value_table(table_id: str, values: dict[str, str]) -> str:
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in values.items())
    return f'<table id="{table_id}">{rows}</table>'


def _rows_table(
    table_id: str, rows: tuple[dict[str, str], ...], *, row_id: str, row_class: str
) -> str:
    if not rows:
        return f'<p id="{table_id}">none recorded</p>'
    columns = list(rows[0])
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="{escape(c.replace(" ", "-"))}">{escape(row.get(c, ""))}</td>'
            for c in columns
        )
        attrs = (
            f'data-id="{escape(row.get(row_id, ""))}" '
            f'class="{row_class}-{escape(row.get(row_class, ""))}"'
        )
        body.append(f"<tr {attrs}>{cells}</tr>")
    return f'<table id="{table_id}"><tr>{head}</tr>{"".join(body)}</table>'
