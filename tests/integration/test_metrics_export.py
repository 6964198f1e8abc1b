"""`antdt monitor|shards --metrics-port P`: a real service process against the session's
nats-server and etcd serves its OpenTelemetry metrics on a Prometheus /metrics endpoint.
Bad step events sent to the monitor show up as rejections there; the shards replica
shows its requests, refusals and ledger writes, and the ledger of the job it owns."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from antdt.runtime.bus import Bus, BusError, RequestRefused
from antdt.runtime.config import ServiceSettings
from antdt.runtime.store import Store
from antdt.schemas import (
    FetchStatus,
    ShardFetch,
    ShardReply,
    ShardStatus,
    ShardStatusRequest,
    Subjects,
)
from tests.helpers import refusal, wait_for
from tests.integration.test_shards_concurrency import register

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


def _samples(port: int, name: str, **labels: str) -> list[float]:
    """Values of the samples called `name` whose labels include `labels`."""
    return [
        sample.value
        for family in text_string_to_metric_families(_scrape(port))
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    ]


async def _value(port: int, name: str, **labels: str) -> float | None:
    """The one sample's value (None: not there yet)."""
    values = await asyncio.to_thread(_samples, port, name, **labels)
    assert len(values) <= 1, (name, labels, values)
    return values[0] if values else None


@contextlib.asynccontextmanager
async def _service(name: str, settings: ServiceSettings) -> AsyncIterator[int]:
    """Run `antdt NAME --metrics-port P` until the block ends; yields P. The process
    must stop cleanly on SIGTERM."""
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
    command = [sys.executable, "-m", "antdt.cli", name, "--metrics-port", str(port)]
    process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
    try:
        await wait_for(lambda: _scrape(port), timeout=30, what="/metrics answering")
        yield port
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode == 0


async def test_monitor_serves_prometheus_metrics(settings: ServiceSettings, bus: Bus) -> None:
    async with _service("monitor", settings) as port:
        subjects = Subjects(settings.nats.subject_prefix)

        def rejected() -> int:
            for line in _scrape(port).splitlines():
                if line.startswith("antdt_monitor_events_rejected") and "bad_request" in line:
                    return int(float(line.rsplit(" ", 1)[1]))
            return 0

        async def send_bad() -> int:  # not JSON: refused by the bus and counted
            await bus.publish_raw(subjects.hello("prom", 0), b"not json")
            await bus.flush()
            return await asyncio.to_thread(rejected)

        # /metrics answers before the monitor subscribes: send until one is counted
        seen = await wait_for(send_bad, timeout=30, interval=0.2, what="a rejection counted")
        for _ in range(3):
            await bus.publish_raw(subjects.hello("prom", 0), b"not json")
        await bus.flush()
        await wait_for(
            lambda: asyncio.to_thread(lambda: rejected() >= seen + 3), timeout=20, what="3 more"
        )
        text = _scrape(port)
        assert f'antdt_replica="{settings.replica_id}"' in text
        assert "antdt_monitor_events_ingested_total" in text
        assert "antdt_monitor_backlog_bytes" in text


async def test_shards_replica_serves_its_requests_writes_and_ledgers(
    settings: ServiceSettings, bus: Bus, store: Store
) -> None:
    job, shards, cycles = "promshards", 40, 6
    await register(store, settings, job, world=2, shards=shards, epochs=1)
    subjects = Subjects(settings.nats.subject_prefix)
    fetch = subjects.shards(job, "fetch")
    async with _service("shards", settings) as port:
        # /metrics answers before the replica subscribes (status last): wait for a status
        # answer, so that every fetch below is sent once and counted once.
        await wait_for(
            lambda: _status(bus, subjects.shards(job, "status"), ShardStatusRequest(job=job)),
            timeout=30,
            interval=0.2,
            what="the replica answering",
        )
        first = await bus.request(fetch, ShardFetch(job=job, rank=0, epoch=0, held=()), ShardReply)
        held = tuple(g.ref() for g in first.grants)
        unconfirmed: tuple[object, ...] = ()
        for _ in range(cycles):  # as the agent does: done, unconfirmed again, next
            request = ShardFetch(job=job, rank=0, epoch=0, done=(*unconfirmed, *held), held=())
            reply = await bus.request(fetch, request, ShardReply)
            assert reply.status is FetchStatus.OK
            held, unconfirmed = tuple(g.ref() for g in reply.grants), reply.unconfirmed
        with pytest.raises(RequestRefused, match="unknown_job"):
            nobody = ShardFetch(job="nobody", rank=0, epoch=0)
            await bus.request(subjects.shards("nobody", "fetch"), nobody, ShardReply)
        refused = await refusal(bus, fetch, b"not json", ShardReply)
        assert refused.code == "bad_request"

        replica = {"antdt_replica": settings.replica_id}

        async def ledger(state: str) -> float | None:
            name = "antdt_shards_ledger_shards"
            return await _value(port, name, antdt_job=job, antdt_shards_state=state)

        async def all_done_marked() -> bool:
            return await ledger("done") == cycles

        # The done marks are written behind: the owner's gauges follow its cached ledger.
        await wait_for(all_done_marked, timeout=20, what="every done mark written")
        in_flight, todo = await ledger("in_flight"), await ledger("todo")
        assert in_flight is not None and todo is not None
        assert in_flight >= 1 and cycles + in_flight + todo == shards
        assert await _value(port, "antdt_shards_ledger_epoch", antdt_job=job) == 0
        assert await _value(port, "antdt_shards_ledger_incarnation", antdt_job=job) == 0
        requests = await _value(
            port, "antdt_shards_requests_total", antdt_shards_verb="fetch", **replica
        )
        assert requests == 1 + cycles + 1  # the unknown job's passed validation
        refused = await asyncio.to_thread(
            _samples, port, "antdt_shards_requests_refused_total", **replica
        )
        assert sum(refused) == 2
        for reason in ("unknown_job", "bad_request"):
            assert await asyncio.to_thread(
                _samples, port, "antdt_shards_requests_refused_total", reason=reason
            )
        commits = await _value(port, "antdt_shards_commits_total", **replica)
        assert commits is not None and commits >= 1
        committed = await _value(port, "antdt_shards_operations_committed_total", **replica)
        assert committed is not None and committed >= commits
        assert await _value(port, "antdt_shards_conflicts_total", **replica) == 0
        store_s = await _value(port, "antdt_shards_store_duration_seconds_total", **replica)
        assert store_s is not None and store_s > 0
        written = await _value(port, "antdt_shards_written_bytes_total", **replica)
        assert written is not None and written > 0


async def _status(bus: Bus, subject: str, request: ShardStatusRequest) -> ShardStatus | None:
    with contextlib.suppress(BusError):  # no responder yet
        return await bus.request(subject, request, ShardStatus, timeout=2)
    return None
