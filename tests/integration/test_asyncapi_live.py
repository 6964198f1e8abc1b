"""The AsyncAPI document (`antdt schemas export`) read by the reference parser
(@asyncapi/parser, under Node.js), and held to what the services really do: every
subscription they make on a real nats-server (its /connz) and every subject they and
their clients send on is a channel of it, each service-bound channel is subscribed, with
the document's queue group."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.runtime.servers import EmbeddedCluster
from antdt.schemas import (
    JobSpec,
    Plan,
    PlanRequest,
    RankHello,
    RegisterReply,
    ShardFetch,
    ShardReply,
    SpecReply,
    SpecRequest,
    Subjects,
)
from antdt.schemas.channels import CHANNELS, MESSAGES
from antdt.schemas.export import ASYNCAPI_JSON, export_schemas
from tests.e2e.conftest import start_services
from tests.helpers import wait_for
from tests.nodejs import ROOT, node

pytestmark = pytest.mark.integration
SERVICES = {"monitor", "controller", "shards"}
PARSE = ROOT / "tests" / "node" / "parse_asyncapi.mjs"


def parse(document: Path) -> dict[str, Any]:
    done = subprocess.run(
        [node(), str(PARSE), str(document)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[:4000] + done.stderr[-4000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def fits(subject: str, address: str) -> bool:
    """Does `subject` (a subscription pattern or a subject sent on) fall under the channel
    `address` (its parameters as `{name}`, each one token)?"""
    a, b = subject.split("."), address.split(".")
    return len(a) == len(b) and all(
        x == y or x == "*" or (y.startswith("{") and y.endswith("}"))
        for x, y in zip(a, b, strict=True)
    )


def test_the_exported_document_parses_with_the_asyncapi_parser(tmp_path: Path) -> None:
    export_schemas(tmp_path, "antdt.v1")
    report = parse(tmp_path / ASYNCAPI_JSON)
    assert report["errors"] == [] and report["warnings"] == []
    subjects = Subjects("antdt.v1")
    for channel in CHANNELS:
        parsed = report["channels"][channel.id]
        assert parsed["address"] == channel.address(subjects)
        assert parsed["messages"] == [channel.message]
        assert sorted(parsed["parameters"]) == sorted(channel.parameters)
        assert report["operations"][channel.id]["replies"] == list(channel.reply_messages())
    assert set(report["messages"]) == set(MESSAGES)


def test_a_document_the_parser_refuses_fails_the_check(tmp_path: Path) -> None:
    export_schemas(tmp_path)
    path = tmp_path / ASYNCAPI_JSON
    broken = json.loads(path.read_text())
    broken["operations"]["proposal"]["action"] = "answer"
    path.write_text(json.dumps(broken))
    with pytest.raises(AssertionError, match="action"):
        parse(path)


def subscriptions(cluster: EmbeddedCluster, prefix: str) -> list[tuple[str, str]]:
    """(subject, queue group) of every subscription under `prefix`, as nats-server has them."""
    url = f"http://127.0.0.1:{cluster.nats.monitor_port}/connz?subs=detail&limit=4096"
    with urllib.request.urlopen(url, timeout=5) as answer:
        connz = json.load(answer)
    return [
        (sub["subject"], sub.get("qgroup", ""))
        for conn in connz.get("connections", [])
        for sub in conn.get("subscriptions_list_detail") or []
        if sub["subject"].startswith(prefix + ".")
    ]


async def test_the_services_subscribe_and_send_on_the_documents_channels_only(
    cluster: EmbeddedCluster, settings: ServiceSettings, bus: Bus
) -> None:
    prefix = settings.nats.subject_prefix
    subjects, job = Subjects(prefix), "contract-live"
    addresses = {c.id: c.address(subjects) for c in CHANNELS}
    sent: list[str] = []

    async def heard(msg: Msg) -> None:
        sent.append(msg.subject)

    tap = await bus.nc.subscribe(f"{prefix}.>", cb=heard)
    running = await start_services(settings, tuple(sorted(SERVICES)), window=4)
    try:
        spec = JobSpec(job=job, world_size=2, dataset_size=100, shard_size=10, global_batch=8)
        hello = RankHello(job=job, rank=0, world_size=2, host="h0", pid=1, started_at=1.0)
        await bus.publish(subjects.hello(job, 0), hello)
        await bus.request(subjects.register(job), spec, RegisterReply)
        await bus.request(subjects.plan_get(job), PlanRequest(job=job), Plan)
        await bus.request(subjects.spec_get(job), SpecRequest(job=job), SpecReply)
        fetch = ShardFetch(job=job, rank=0, epoch=0, held=())
        await bus.request(subjects.shards(job, "fetch"), fetch, ShardReply, timeout=10)
        step = subjects.step(job, "*")  # the monitor subscribes a job's steps once it owns it

        def subscribed() -> list[tuple[str, str]] | None:
            subs = subscriptions(cluster, prefix)
            return subs if any(s == step for s, _ in subs) else None

        subs = await wait_for(subscribed, timeout=20, what="the job's steps subscribed")
        await bus.flush()
    finally:
        await running.runtime.shutdown()
        await tap.unsubscribe()
    subs = [(s, q) for s, q in subs if s != f"{prefix}.>"]  # the test's own tap
    for subject, queue in subs:
        matching = [c for c in CHANNELS if fits(subject, addresses[c.id])]
        assert matching, f"subscribed to {subject}: no channel of the document"
        assert any((c.queue or "") == queue for c in matching), (subject, queue)
    for channel in CHANNELS:
        if SERVICES & set(channel.receivers):
            assert any(fits(s, addresses[channel.id]) for s, _ in subs), channel.id
    for subject in sent:
        assert any(fits(subject, a) for a in addresses.values()), f"sent on {subject}"
    assert {subjects.hello(job, 0), subjects.register(job), subjects.spec_get(job)} <= set(sent)
