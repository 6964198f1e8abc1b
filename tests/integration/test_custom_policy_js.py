"""The JavaScript custom policy (examples/custom_policy_js/policy.mjs, Node.js with the
`nats` and `ajv` packages) as its own process against real nats-server, etcd, monitor and
controller, with stand-in ranks acking commands, validating its messages against the
schemas `antdt schemas export` wrote: its proposal is applied on every rank, a bad one is
refused with the reason, and a proposal for an ended job is answered job_ended."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.runtime.store import Store
from antdt.schemas import (
    ACTION_STREAM,
    INCIDENT_STREAM,
    ActionRecord,
    ActionResult,
    JobSpec,
    Keys,
    RegisterReply,
    Subjects,
)
from antdt.schemas.export import export_schemas
from antdt.testing import acking_ranks
from tests.e2e.conftest import RunningServices, start_services
from tests.helpers import wait_for
from tests.integration.test_contract import ended_health
from tests.nodejs import ROOT, node
from tests.policyproc import PolicyProcess, announce_cap, incident, start_policy_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]
POLICY = ROOT / "examples" / "custom_policy_js" / "policy.mjs"
WORLD, BATCH = 4, 64


@pytest.fixture
async def services(settings: ServiceSettings) -> AsyncIterator[RunningServices]:
    running = await start_services(settings, ("monitor", "controller"), ack_deadline_s=2.0)
    yield running
    await running.runtime.shutdown()


async def start_policy(settings: ServiceSettings, schemas: Path, durable: str) -> PolicyProcess:
    argv = [node(), str(POLICY), "--schemas", str(schemas), "--durable", durable]
    return await start_policy_process(settings, argv, cwd=POLICY.parent)


async def test_js_policy_applied_refused_and_told_the_job_ended(
    services: RunningServices,
    settings: ServiceSettings,
    bus: Bus,
    store: Store,
    unique: str,
    tmp_path: Path,
) -> None:
    node()  # skip (or fail under CI) before anything starts when Node's packages are missing
    job, ended, durable = f"js-{unique}", f"js-ended-{unique}", f"js-{unique}"
    subjects, keys = Subjects(settings.nats.subject_prefix), Keys(settings.etcd.key_prefix)
    export_schemas(tmp_path, settings.nats.subject_prefix)
    for name in (job, ended):
        spec = JobSpec(
            job=name, world_size=WORLD, dataset_size=1000, shard_size=10, global_batch=BATCH
        )
        await bus.request(subjects.register(name), spec, RegisterReply)
    ranks = await acking_ranks(settings.nats, job, WORLD).start()
    policy = await start_policy(settings, tmp_path, durable)
    try:
        # 1. Rank 3 is 3x slower: its even share 16 / 3 -> 5, 11 samples to ranks 0-2.
        await bus.jetstream.publish(subjects.incident(job), incident(job, 1, rank=3, ratio=3.0))
        await ranks.wait_version(1, timeout=20)
        applied = await wait_for(lambda: policy.events("applied"), timeout=20, what="applied")
        assert applied[0]["plan_version"] == 1 and applied[0]["local_batch"] == [20, 20, 19, 5]
        assert {ranks.plans[r][1].local_batch for r in range(WORLD)} == {(20, 20, 19, 5)}

        # 2. Rank 0 holds at most 20; rank 1 turns 2x slower: 12 samples off it, 4 of them
        # to rank 0 (24 > 20): refused with the reason, the plan untouched.
        jobs = services.by_name["controller"].jobs
        await announce_cap(bus, jobs, job, WORLD, rank=0, cap=20)
        await bus.jetstream.publish(subjects.incident(job), incident(job, 2, rank=1, ratio=2.0))
        refused = await wait_for(lambda: policy.events("refused"), timeout=20, what="refused")
        assert refused[0]["code"] == "guardrail" and refused[0]["action"] == "fix"
        assert refused[0]["reason"] == "rank 0: batch 24 exceeds its memory cap 20"

        # 3. Every rank of the other job exited: its proposal is answered job_ended.
        last = ended_health(ended, step=30)
        await store.put(keys.ended(ended), last.model_dump_json().encode())
        await bus.publish(subjects.health(ended), last)
        owner = keys.owner("controller", ended)
        await wait_for(lambda: _absent(store, owner), what="the ended job given up")
        await bus.jetstream.publish(subjects.incident(ended), incident(ended, 1, rank=2, ratio=3.0))
        told = await wait_for(
            lambda: [e for e in policy.events("refused") if e["job"] == ended],
            timeout=20,
            what="job_ended",
        )
        assert told[0]["code"] == "job_ended" and told[0]["action"] == "give_up"
        assert "ended" in told[0]["reason"]

        records = (
            await bus.jetstream.read(ACTION_STREAM, subjects.action(job), ActionRecord)
        ).items
        assert [r.result for r in records] == [ActionResult.APPLIED, ActionResult.REFUSED]
        assert records[0].policy == "proposal:example-policy-js"
        assert not policy.events("invalid") and not policy.events("retry")
    finally:
        await policy.stop()
        await ranks.close()
        with contextlib.suppress(Exception):
            await bus.nc.jetstream().delete_consumer(INCIDENT_STREAM, durable)


async def _absent(store: Store, key: str) -> bool:
    return await store.get(key) is None
