"""A real job against three-node clusters: 4 gloo ranks of antdt.demo.train under antdt-nd,
rank 3's host three times slower from step 30, the services and ranks given every member
of a NATS cluster (JetStream streams R3) and of an etcd cluster. Before the onset, the
NATS node the controller uses and the etcd member gRPC uses first are killed -9: the
straggler is still mitigated, the job finishes, no action is missing from the replicated
stream and every sample reaches the model exactly once."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from antdt.agent.samplelog import exactly_once_problems, read_sample_logs
from antdt.observe import ensure_recording
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import ServiceSettings
from antdt.schemas import ACTION_STREAM, ActionRecord, ActionResult, StepEvent, Subjects
from tests.clusters import Clusters, retry, running_clusters
from tests.e2e.conftest import start_services
from tests.e2e.test_kill_restart import BATCH, DATASET, EPOCHS, ONSET, WINDOW, WORLD, restart_env
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.integration]

#: The step of rank 0 after which the nodes are killed: before the onset, so that the
#: detection, the plan and the acks all run on what is left of each cluster.
KILL_AT = ONSET - 10


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[Clusters]:
    with running_clusters(tmp_path / "servers") as running:
        yield running


async def test_straggler_mitigated_and_nothing_lost_with_a_node_of_each_cluster_killed(
    clusters: Clusters, tmp_path: Path, unique: str
) -> None:
    from antdt.agent.launch import launch

    settings = ServiceSettings(
        nats=clusters.nats_settings(f"antdt.{unique}"),
        etcd=clusters.etcd_settings(f"/antdt-test/{unique}/", lease_ttl_s=2),
        replica_id=f"replica-{unique}",
    )
    job, subjects = f"cl-{unique}", Subjects(settings.nats.subject_prefix)
    bus = await Bus(settings.nats, name="clusters-job").connect(retry_for_s=20)
    actions: list[ActionRecord] = []
    steps: list[StepEvent] = []

    async def on_action(record: ActionRecord, _: Delivery) -> None:
        actions.append(record)

    async def on_step(event: StepEvent, _: Delivery) -> None:
        steps.append(event)

    await bus.subscribe(subjects.action(job), ActionRecord, on_action)
    await bus.subscribe(subjects.step(job, "*"), StepEvent, on_step)
    # JetStream answers once its meta leader is elected, a moment after the nodes are up
    await retry(lambda: ensure_recording(bus, subjects, settings.recording), pause=0.2)
    running = await start_services(settings, window=WINDOW, slow_threshold=0.5)
    controller_log = running.by_name["controller"].executor.actions
    try:
        command = [sys.executable, "-m", "antdt.demo.train"]
        env = restart_env(settings, job, tmp_path)
        ranks = asyncio.ensure_future(
            asyncio.to_thread(launch, WORLD, command, env=env, spare_slots=1)
        )
        try:
            await wait_for(
                lambda: any(e.rank == 0 and e.step >= KILL_AT for e in steps) or ranks.done(),
                timeout=120,
                what=f"rank 0 past step {KILL_AT}",
            )
            used = running.by_name["controller"].bus.nc.connected_url
            assert used is not None, "the controller is not connected"
            killed_nats = next(n for n in clusters.nats if n.port == used.port)
            killed_nats.kill()
            clusters.etcd[0].kill()
            killed_at = max(e.step for e in steps if e.rank == 0)
            rc = await ranks
        finally:
            await asyncio.wait([ranks])
        recorded = await retry(
            lambda: bus.jetstream.read(ACTION_STREAM, subjects.action(job), ActionRecord)
        )
    finally:
        await running.runtime.shutdown()
        await bus.close()
    assert rc == 0
    last = max(e.step for e in steps if e.rank == 0)
    assert killed_at < ONSET < last, (killed_at, last)  # killed mid-run, before the onset

    # 1. the straggler was mitigated after the kill: its batch cut, or its rank restarted
    applied = [a for a in actions if a.result == ActionResult.APPLIED]
    relieving = [
        a
        for a in applied
        if (a.kind == "adjust_batch" and a.local_batch and a.local_batch[3] < BATCH // WORLD)
        or (a.kind == "kill_restart" and a.rank == 3)
    ]
    assert relieving, [(a.kind, a.result, a.local_batch, a.rank) for a in actions]
    print("\n" + "\n".join(f"{a.kind} step={a.effective_step} {a.reason}" for a in applied))

    # 2. every record the controller made is in the replicated stream once, and every
    # record seen live is among them (a core subscriber may miss one across the kill:
    # at most once; the stream is the record that must hold them all)
    stored = Counter((a.action_id, a.result) for a in recorded.items)
    assert max(stored.values()) == 1, stored
    assert {(a.action_id, a.result) for a in actions} <= set(stored)
    made = controller_log.counts
    assert {r: made[job, r.value] for r in ActionResult} == {
        r: sum(1 for _, result in stored if result == r) for r in ActionResult
    }

    # 3. every sample of every epoch reached the final model exactly once
    lines = read_sample_logs(tmp_path / "samples", WORLD)
    assert exactly_once_problems(lines, DATASET, EPOCHS) == []
