"""`antdt monitor --metrics-port P`: a real monitor process against the session's
nats-server and etcd serves its OpenTelemetry metrics on a Prometheus /metrics endpoint;
bad step events sent to it show up as rejections there."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.schemas import Subjects
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
            return str(reply.read().decode())
    except OSError:
        return ""


async def test_monitor_serves_prometheus_metrics(settings: ServiceSettings, bus: Bus) -> None:
    port = _free_port()
    env = dict(
        os.environ,
        ANTDT_NATS__URL=settings.nats.url,
        ANTDT_NATS__SUBJECT_PREFIX=settings.nats.subject_prefix,
        ANTDT_ETCD__ENDPOINT=settings.etcd.endpoint,
        ANTDT_ETCD__KEY_PREFIX=settings.etcd.key_prefix,
        ANTDT_REPLICA_ID=settings.replica_id,
        ANTDT_RECORDING__ENABLED="false",
        ANTDT_TELEMETRY__LOG_LEVEL="warning",
    )
    command = [sys.executable, "-m", "antdt.cli", "monitor", "--metrics-port", str(port)]
    process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
    try:
        await wait_for(lambda: _scrape(port), timeout=30, what="/metrics answering")
        subjects = Subjects(settings.nats.subject_prefix)

        def rejected() -> int:
            for line in _scrape(port).splitlines():
                if line.startswith("antdt_monitor_events_rejected") and "bad_request" in line:
                    return int(float(line.rsplit(" ", 1)[1]))
            return 0

        async def send_bad() -> int:  # not JSON: refused by the bus and counted
            await bus.publish_raw(subjects.step("prom", 0), b"not json")
            await bus.flush()
            return await asyncio.to_thread(rejected)

        # /metrics answers before the monitor subscribes: send until one is counted
        seen = await wait_for(send_bad, timeout=30, interval=0.2, what="a rejection counted")
        for _ in range(3):
            await bus.publish_raw(subjects.step("prom", 0), b"not json")
        await bus.flush()
        await wait_for(
            lambda: asyncio.to_thread(lambda: rejected() >= seen + 3), timeout=20, what="3 more"
        )
        text = _scrape(port)
        assert f'antdt_replica="{settings.replica_id}"' in text
        assert "antdt_monitor_events_ingested_total" in text
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode == 0
