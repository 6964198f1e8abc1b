"""examples/ddp_dataloader: the AntDT version is the plain DDP + DataLoader script plus a
small diff, and train.diff (shown in its README) is that diff, regenerated here."""

from __future__ import annotations

import difflib
from pathlib import Path

FOLDER = Path(__file__).resolve().parents[2] / "examples" / "ddp_dataloader"


def current_diff() -> str:
    plain = (FOLDER / "train_plain.py").read_text().splitlines(keepends=True)
    ours = (FOLDER / "train.py").read_text().splitlines(keepends=True)
    return "".join(difflib.unified_diff(plain, ours, "train_plain.py", "train.py"))


def test_the_shown_diff_is_the_scripts_diff_and_stays_small() -> None:
    diff = current_diff()
    assert (FOLDER / "train.diff").read_text() == diff, "regenerate train.diff"
    changed = [ln for ln in diff.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    assert len([ln for ln in changed if ln.startswith("-")]) <= 15
    assert len([ln for ln in changed if ln.startswith("+")]) <= 15
    readme = (FOLDER / "README.md").read_text()
    assert diff in readme
