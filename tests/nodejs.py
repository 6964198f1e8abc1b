"""Node.js for the tests that run JavaScript: the packages `make node` installs (npm ci,
versions pinned in package-lock.json) into the repository's node_modules. Missing, such a
test is skipped with how to install them; under CI (CI=true) it fails instead."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NODE_MODULES = ROOT / "node_modules"
PACKAGES = ("@asyncapi/parser", "nats", "ajv")


def node() -> str:
    """The node executable, once the project's packages are installed."""
    found = shutil.which("node")
    missing = [p for p in PACKAGES if not (NODE_MODULES / p / "package.json").exists()]
    if found and not missing:
        return found
    why = "node is not on PATH" if not found else f"node_modules lacks {', '.join(missing)}"
    message = f"{why}: run `make node` (npm ci) first"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
