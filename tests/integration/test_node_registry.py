"""The node registry over a real controller, nats-server and etcd: torchrun's rendezvous
gate (NodeGate) joins and heartbeats; a blocklisted host and a second process for one
host are refused with their codes, nothing lost; an expired record frees the name; the
owner's view counts a registered waiting node as a free spare."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from antdt.agent.nodegate import GateSettings, NodeGate
from antdt.agent.restart import BLOCKED_EXIT_CODE
from antdt.runtime.bus import Bus, Delivery, RequestRefused
from antdt.runtime.config import NatsSettings, ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.store import Store
from antdt.schemas import (
    ActionRecord,
    ActionResult,
    BlocklistEntry,
    ErrorCode,
    JobSpec,
    Keys,
    NodeAdmission,
    NodeJoin,
    NodeRecord,
    NodeState,
    RegisterReply,
    Subjects,
)
from antdt.services.controller.actions import KillRestartAction
from antdt.services.controller.service import ControllerService
from antdt.services.runner import settings_class, start_service
from tests.helpers import wait_for

pytestmark = pytest.mark.integration
TTL_S = 1.5
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def controller(settings: ServiceSettings) -> AsyncIterator[ControllerService]:
    runtime = ServiceRuntime("test-controller")
    cls = settings_class("controller")
    service = await start_service(
        "controller", cls(**{**settings.model_dump(), "node_ttl_s": TTL_S}), runtime
    )
    yield service
    await runtime.shutdown()


def join(job: str, host: str, process: str) -> NodeJoin:
    return NodeJoin(
        job=job,
        host=host,
        process=process,
        address="127.0.0.1",
        state=NodeState.JOINING,
        run_id="run",
        restart_round=0,
    )


def gate(settings: ServiceSettings, job: str, host: str, **fields: float) -> NodeGate:
    nats = NatsSettings(url=settings.nats.url, subject_prefix=settings.nats.subject_prefix)
    return NodeGate(GateSettings(nats=nats, job=job, host=host, **fields), run_id="run")


async def record(store: Store, settings: ServiceSettings, job: str, host: str) -> NodeRecord:
    got = await store.get_model(Keys(settings.etcd.key_prefix).node(job, host), NodeRecord)
    assert got is not None
    return got[0]


async def test_a_join_is_admitted_and_heartbeats_keep_the_record(
    controller: ControllerService, settings: ServiceSettings, store: Store, unique: str
) -> None:
    node = gate(settings, unique, "node-a", heartbeat_s=0.3)
    try:
        assert await asyncio.to_thread(node.join) is None
        first = await record(store, settings, unique, "node-a")
        assert (first.process, first.state) == (node.process, NodeState.JOINING)

        async def beaten() -> bool:
            now = await record(store, settings, unique, "node-a")
            return now.state == NodeState.WAITING and now.seen_at > first.seen_at

        await wait_for(beaten, what="a heartbeat")
        await asyncio.sleep(TTL_S + 0.5)  # beats keep it alive past one ttl
        kept = await record(store, settings, unique, "node-a")
        assert kept.live(time.time()) and kept.registered_at == first.registered_at
    finally:
        node.close()
    assert controller.nodes.counts[(unique, "joined")] == 1


async def test_a_blocklisted_host_is_refused_with_its_code(
    controller: ControllerService, settings: ServiceSettings, store: Store, bus: Bus, unique: str
) -> None:
    keys = Keys(settings.etcd.key_prefix)
    entry = BlocklistEntry(
        host="node-b", job=unique, rank=1, action_id=f"{unique}-restart-1", at=time.time()
    )
    await store.put(keys.blocklist("node-b"), entry.model_dump_json().encode())
    node = gate(settings, unique, "node-b")
    try:
        refusal = await asyncio.to_thread(node.join)
    finally:
        node.close()
    assert refusal is not None and refusal.code == ErrorCode.BLOCKLISTED
    assert "node-b" in refusal.error and "blocklist" in refusal.error
    assert await store.get(keys.node(unique, "node-b")) is None
    assert controller.nodes.counts[(unique, "blocklisted")] == 1
    # The subject's job must be the message's: refused as bad input, not a crash.
    with pytest.raises(RequestRefused) as bad:
        subject = Subjects(settings.nats.subject_prefix).node_join("other")
        await bus.request(subject, join(unique, "node-x", "p"), NodeAdmission)
    assert bad.value.reply.code == ErrorCode.BAD_REQUEST


async def test_a_second_process_for_one_host_is_refused_until_the_first_expires(
    controller: ControllerService, settings: ServiceSettings, store: Store, bus: Bus, unique: str
) -> None:
    subject = Subjects(settings.nats.subject_prefix).node_join(unique)
    admitted = await bus.request(subject, join(unique, "node-c", "first"), NodeAdmission)
    assert admitted.ttl_s == TTL_S
    with pytest.raises(RequestRefused) as taken:
        await bus.request(subject, join(unique, "node-c", "second"), NodeAdmission)
    assert taken.value.reply.code == ErrorCode.NODE_TAKEN
    assert "first" in taken.value.reply.error
    assert (await record(store, settings, unique, "node-c")).process == "first"  # kept
    # The gate of the second gives up after taken_wait_s with the same code.
    second = gate(settings, unique, "node-c", taken_wait_s=0.0)
    try:
        refusal = await asyncio.to_thread(second.join)
    finally:
        second.close()
    assert refusal is not None and refusal.code == ErrorCode.NODE_TAKEN
    # No heartbeat from "first": its record lapses, and the name is free.
    await asyncio.sleep(max(0.0, admitted.expires_at - time.time()) + 0.1)
    await bus.request(subject, join(unique, "node-c", "second"), NodeAdmission)
    assert (await record(store, settings, unique, "node-c")).process == "second"


async def test_the_owner_counts_a_waiting_node_as_a_free_spare(
    controller: ControllerService, settings: ServiceSettings, bus: Bus, unique: str
) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    spec = JobSpec(job=unique, world_size=2, dataset_size=64, shard_size=8, global_batch=8)
    await bus.request(subjects.register(unique), spec, RegisterReply)
    spare = gate(settings, unique, "node-s", heartbeat_s=0.2)
    try:
        assert await asyncio.to_thread(spare.join) is None

        def spares() -> tuple[str, ...]:
            state = controller.jobs.get(unique)
            return state.view(time.time()).free_spares if state else ()

        await wait_for(lambda: spares() == ("node-s",), what="spare seen by the owner")
        spare.state = NodeState.PARTICIPANT  # its next beat: it hosts ranks now
        await wait_for(lambda: spares() == (), what="participant is no spare")
    finally:
        spare.close()


def test_a_gate_admits_when_no_controller_answers(settings: ServiceSettings, unique: str) -> None:
    node = gate(settings, unique, "node-d", join_timeout_s=1.0)
    started = time.monotonic()
    try:
        assert node.join() is None  # fail-open: nobody subscribes node.join here
    finally:
        node.close()
    assert time.monotonic() - started < 5


async def test_no_free_spare_holds_a_restart_and_records_why_once(
    controller: ControllerService, settings: ServiceSettings, bus: Bus, unique: str
) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    records: list[ActionRecord] = []

    async def on_action(record: ActionRecord, _: Delivery) -> None:
        records.append(record)

    await bus.subscribe(subjects.action(unique), ActionRecord, on_action)
    spec = JobSpec(job=unique, world_size=2, dataset_size=64, shard_size=8, global_batch=8)
    await bus.request(subjects.register(unique), spec, RegisterReply)
    busy = join(unique, "node-a", "p").model_copy(update={"state": NodeState.PARTICIPANT})
    await bus.request(subjects.node_join(unique), busy, NodeAdmission)
    state = await wait_for(
        lambda: (s := controller.jobs.get(unique)) and "node-a" in s.nodes and s,
        what="the owner's registry read",
    )
    action = KillRestartAction(
        action_id=f"{unique}-restart-1", rank=1, host="node-a", reason="antdt-nd kill_restart"
    )
    for _ in range(2):  # the policy asks again at every health tick
        view = state.view(time.time())
        record = await controller.executor.apply(state, action, view)
        assert record.result == ActionResult.REFUSED
        assert record.error and record.error.startswith("no free spare node"), record.error
    await wait_for(lambda: records, what="the refusal on ANTDT_ACTIONS")
    await asyncio.sleep(0.3)
    assert [(r.kind, r.result, r.reason) for r in records] == [
        ("kill_restart", ActionResult.REFUSED, "antdt-nd kill_restart")
    ]
    assert state.restarts.count == 0  # no budget used, nothing blocklisted
    # Recorded under an id of its own: the restart, once a spare is free, is recorded
    # under its plain id, which ANTDT_ACTIONS would otherwise drop as a duplicate (and a
    # takeover would take for done).
    recorded = await controller.executor.actions.recorded_ids(unique)
    assert action.action_id not in recorded
    assert [i.startswith(f"{action.action_id}-refused-") for i in recorded] == [True]


async def test_torchrun_on_a_blocklisted_host_exits_76_with_its_message(
    controller: ControllerService, settings: ServiceSettings, store: Store, unique: str
) -> None:
    keys = Keys(settings.etcd.key_prefix)
    entry = BlocklistEntry(
        host="node-x", job=unique, rank=0, action_id=f"{unique}-restart-1", at=time.time()
    )
    await store.put(keys.blocklist("node-x"), entry.model_dump_json().encode())
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        ANTDT_JOB=unique,
        ANTDT_HOST="node-x",
        ANTDT_NATS__URL=settings.nats.url,
        ANTDT_NATS__SUBJECT_PREFIX=settings.nats.subject_prefix,
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2:2",
        "--rdzv-backend=antdt",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={unique}",
        "-m",
        "antdt.demo.train",  # never started: the node is refused first
    ]
    done = await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == BLOCKED_EXIT_CODE, done.stderr[-3000:]
    assert f"antdt: node node-x may not join job {unique} (blocklisted)" in done.stderr
