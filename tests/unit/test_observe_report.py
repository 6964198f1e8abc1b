"""`antdt report` without servers: a recorded run -> PNG and self-contained HTML files that
are opened and checked for the marked action."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from antdt.observe import ReportEmpty, RunRecord, write_report
from antdt.observe.timeline import ACTION_COLOR
from tests.unit.test_observe_timeline import synthetic_run


def marker_columns(png: Path, color: str = ACTION_COLOR, min_share: float = 0.5) -> list[int]:
    """Pixel columns where `color` runs over at least `min_share` of the image's height:
    the vertical markers drawn in that colour (drawn without anti-aliasing)."""
    image = imread(png)[..., :3]
    rgb = np.array([int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    mask = np.all(np.abs(image - rgb) < 1.5 / 255, axis=-1)
    counts = mask.sum(axis=0)
    return [int(c) for c in np.nonzero(counts >= min_share * image.shape[0])[0]]


class ReportHtml(HTMLParser):
    """Rows of the report's tables (by table id) and the figure's text."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[dict[str, str]]] = {}
        self.svg_text: list[str] = []
        self.tags: set[str] = set()
        self.attrs: list[tuple[str, str | None]] = []
        self._table = ""
        self._in_svg_text = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs += attrs
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("id") or ""
            self.tables[self._table] = []
        elif tag == "tr" and a.get("data-id") is not None:
            self.tables[self._table].append({"id": a["data-id"] or "", "class": a["class"] or ""})
        elif tag == "text":
            self._in_svg_text = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "text":
            self._in_svg_text = False

    def handle_data(self, data: str) -> None:
        if self._in_svg_text:
            self.svg_text.append(data)


def parse_report(html: Path) -> ReportHtml:
    parser = ReportHtml()
    parser.feed(html.read_text(encoding="utf-8"))
    return parser


def test_report_files_show_the_applied_action(tmp_path: Path) -> None:
    files = write_report(synthetic_run(), tmp_path / "out")
    assert files.png == tmp_path / "out" / "job-a.png" and files.html.suffix == ".html"
    assert marker_columns(files.png), "no applied-action marker in the PNG"

    page = parse_report(files.html)
    assert {"id": "act-1", "class": "result-applied"} in page.tables["actions"]
    assert {"id": "act-0", "class": "result-refused"} in page.tables["actions"]
    assert page.tables["incidents"] == [{"id": "job-a-r3-slow-1", "class": "state-escalated"}]
    assert "adjust_batch [72, 72, 72, 40] applied" in page.svg_text  # the marker's label
    assert "r3 slow/persistent escalated" in page.svg_text
    assert "svg" in page.tags


def test_html_is_self_contained(tmp_path: Path) -> None:
    page = parse_report(write_report(synthetic_run(), tmp_path).html)
    assert not {"script", "link", "iframe", "img"} & page.tags
    external = [v for k, v in page.attrs if k in ("src", "href") and v and "://" in v]
    assert external == []


def test_no_action_no_marker(tmp_path: Path) -> None:
    run = synthetic_run()
    run.actions = []
    files = write_report(run, tmp_path)
    assert marker_columns(files.png) == []
    assert parse_report(files.html).tables.get("actions") is None  # "none recorded"


def test_nothing_recorded_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ReportEmpty, match="nothing recorded for job 'ghost'"):
        write_report(RunRecord(job="ghost", notes=["stream ANTDT_STEPS does not exist"]), tmp_path)
    assert not list(tmp_path.iterdir())
