"""Liveness and readiness of a service process, as its probes read them over HTTP."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from antdt.runtime.telemetry import Health, Readiness, setup_metrics
from antdt.runtime.telemetry.health import LIVE_WITHIN_S


def test_readiness_moves_only_along_its_diagram() -> None:
    health = Health()
    health.move(Readiness.READY)
    health.move(Readiness.STOPPING)
    health.move(Readiness.STOPPING)  # staying is no move
    with pytest.raises(ValueError, match="from stopping to ready"):
        health.move(Readiness.READY)
    assert Health(state=Readiness.STARTING).state is Readiness.STARTING


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_probes_are_served_beside_the_metrics() -> None:
    health = Health()
    exported = setup_metrics(
        "antdt-probe-test", port=0, host="127.0.0.1", install=False, health=health
    )
    assert exported is not None and exported.port
    try:
        assert _get(exported.port, "/readyz") == (503, "starting\n")
        assert _get(exported.port, "/livez") == (200, "live\n")
        health.move(Readiness.READY)
        assert _get(exported.port, "/readyz") == (200, "ready\n")
        assert _get(exported.port, "/metrics")[0] == 200
        health.beat(time.monotonic() - LIVE_WITHIN_S - 1)  # the loop stopped turning
        assert _get(exported.port, "/livez") == (503, "loop stuck\n")
        health.move(Readiness.STOPPING)
        assert _get(exported.port, "/readyz") == (503, "stopping\n")
    finally:
        exported.flush(timeout_s=1)
