"""The GPU tests' ranks choose their backend as users' ranks do: the suite pins
ANTDT_BACKEND=gloo in its own environment (tests/conftest.py), and `launch` adds a
test's env to os.environ, so dropping it from that env alone left every rank on gloo
and its model on the CPU."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def backend_by_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTDT_BACKEND", raising=False)
