"""The controller's KILL_RESTART against real nats-server and etcd, with a test double for
the ranks (plain NATS subscribers that ack as the agent contract says): antdt-nd adjusts
batches at once, restarts the persistent straggler when it pays, fences its etcd writes,
measures the restart cost from health; bad acks are refused with reasons."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import ServiceSettings
from antdt.runtime.store import Store
from antdt.schemas import (
    ACTION_STREAM,
    Ack,
    ActionRecord,
    ActionResult,
    AdjustBatch,
    BlocklistEntry,
    IncidentState,
    JobSpec,
    Keys,
    KillRestart,
    PendingRestart,
    Plan,
    RegisterReply,
    RestartLedger,
    StragglerClass,
    Subjects,
)
from antdt.services.controller.policies import KillRestartAction
from antdt.services.controller.service import ControllerService
from antdt.services.controller.state import JobState
from antdt.testing import FakeRanks
from tests.e2e.conftest import RunningServices, start_services
from tests.helpers import wait_for

pytestmark = pytest.mark.integration

STRAGGLER = (1000.0, 1000.0, 1000.0, 1000.0 / 3)
HEALTHY = (1000.0,) * 4
SLOTS = {r: f"slot{r}" for r in range(4)}
PARAMS = {"restart_cost_s": 1.0, "settle_steps": 2, "cooldown_s": 0.0}


@pytest.fixture
async def running(settings: ServiceSettings) -> AsyncIterator[RunningServices]:
    # Acks that never come are waited for until the deadline: long enough that a stalled
    # machine (CI's do stall) does not turn the ranks' real acks into missing ones.
    services = await start_services(
        settings, names=("controller",), ack_deadline_s=2.5, ack_timeout_s=0.3
    )
    yield services
    await services.runtime.shutdown()


class Job:
    """One registered antdt-nd job, its fake ranks and what the controller recorded."""

    def __init__(self, bus: Bus, store: Store, settings: ServiceSettings, name: str) -> None:
        self.bus, self.store, self.name = bus, store, name
        self.subjects = Subjects(settings.nats.subject_prefix)
        self.keys = Keys(settings.etcd.key_prefix)
        self.ranks = FakeRanks(bus, self.subjects, name, 4)
        self.records: list[ActionRecord] = []

    async def start(self, controller: ControllerService, **params: Any) -> Job:
        async def on_record(record: ActionRecord, _: Delivery) -> None:
            self.records.append(record)

        await self.bus.subscribe(self.subjects.action(self.name), ActionRecord, on_record)
        await self.ranks.start()
        spec = JobSpec(
            job=self.name,
            world_size=4,
            dataset_size=10_000_000,
            shard_size=100,
            global_batch=128,
            policy="antdt-nd",
            policy_params={**PARAMS, **params},
        )
        await self.bus.request(self.subjects.register(self.name), spec, RegisterReply)
        await wait_for(lambda: controller.ownership.owns(self.name), what="controller owns job")
        await self.ranks.hello(SLOTS)
        jobs = controller.jobs
        await wait_for(lambda: self.name in jobs and len(jobs[self.name].hosts) == 4, what="hello")
        return self

    def kinds(self) -> list[str]:
        return [r.kind for r in self.records]

    async def plan(self) -> Plan:
        stored = await self.store.get_model(self.keys.plan(self.name), Plan)
        assert stored is not None
        return stored[0]

    async def ledger(self) -> RestartLedger:
        stored = await self.store.get_model(self.keys.restarts(self.name), RestartLedger)
        return stored[0] if stored else RestartLedger()

    async def adjust_then_escalate(self) -> None:
        """Rank 3 slow: the incident opens (ADJUST_BS), then turns persistent."""
        await self.ranks.health(STRAGGLER, step=10, plan_version=0)
        await self.ranks.incident(3, "slot3", IncidentState.OPENED)
        await wait_for(lambda: "adjust_batch" in self.kinds(), what="ADJUST_BS")
        effective = (await self.plan()).effective_step
        await self.ranks.incident(3, "slot3", IncidentState.ESCALATED, StragglerClass.PERSISTENT)
        await self.ranks.health(STRAGGLER, step=effective + 5, plan_version=1)


async def test_adjust_then_restart_measure_and_stop(
    running: RunningServices, bus: Bus, store: Store, settings: ServiceSettings, unique: str
) -> None:
    controller: ControllerService = running.by_name["controller"]
    job = await Job(bus, store, settings, f"{unique}-nd").start(controller)
    await job.adjust_then_escalate()
    await wait_for(lambda: "kill_restart" in job.kinds(), what="KILL_RESTART record")
    [adjust, kill] = [r for r in job.records if r.action_id.endswith(("plan-1", "restart-1"))]
    assert adjust.local_batch == (39, 38, 38, 13) and adjust.result == ActionResult.APPLIED
    assert kill.result == ActionResult.APPLIED and kill.acked_ranks == (0, 1, 2, 3)
    assert (kill.rank, kill.host) == (3, "slot3") and kill.incident_id
    step = kill.effective_step
    assert step is not None
    assert {
        (r, c.checkpoint_step, c.avoid_hosts)
        for r, c in job.ranks.received
        if isinstance(c, KillRestart)
    } == {(r, step, ("slot3",)) for r in range(4)}
    # etcd: the ledger and the blocklist in one txn; the plan for after the restart.
    ledger = await job.ledger()
    assert ledger.count == 1 and ledger.pending is not None
    assert ledger.pending.checkpoint_step == step
    entry = await store.get_model(job.keys.blocklist("slot3"), BlocklistEntry)
    assert entry is not None and entry[0].action_id == kill.action_id
    await wait_for(lambda: controller.blocklist.hosts(time.time()) == {"slot3"}, what="blocklist")
    assert entry[0].until == entry[0].at + controller.settings.blocklist_ttl_s
    await wait_for(lambda: len(job.records) >= 3, what="plan after the restart recorded")
    after = await job.plan()
    assert (after.version, after.local_batch, after.effective_step) == (2, (32,) * 4, step + 1)
    # The plan for after the restart is recorded before the restart (which closes it).
    assert [r.action_id.removeprefix(job.name) for r in job.records] == [
        "-plan-1",
        "-plan-2",
        "-restart-1",
    ]
    # The job stops at the checkpoint step and resumes 7 s later (times are values).
    t0 = time.time()
    await job.ranks.health(STRAGGLER, step=step, plan_version=1, at=t0)
    await job.ranks.health(STRAGGLER, step=step, plan_version=1, at=t0 + 3)
    await job.ranks.hello({3: "slot4"})
    state = controller.jobs[job.name]
    await wait_for(lambda: state.hosts[3] == "slot4", what="the new process's hello")
    await job.ranks.health(
        HEALTHY, step=step + 3, plan_version=2, at=t0 + 7, hosts={**SLOTS, 3: "slot4"}
    )
    measured = await wait_for(lambda: _costs(job), what="restart cost measured")
    assert measured == (pytest.approx(7 - 2 * 0.1 - 0.1),)
    # etcd has it first; the controller's own copy follows once its transaction returned.
    await wait_for(
        lambda: state.view(time.time()).restarts.measured_cost_s is not None,
        what="the measured cost in the controller's view",
    )
    view = state.view(time.time())
    assert view.restarts.measured_cost_s == pytest.approx(6.7)
    assert view.hosts[3] == "slot4" and view.restarts.pending is None
    # Each rank got every command once (retries aside) and applied each once.
    assert set(job.ranks.applied.values()) == {1}


async def _costs(job: Job) -> tuple[float, ...]:
    return (await job.ledger()).costs


async def test_bad_acks_are_refused_and_nothing_applied(
    running: RunningServices, bus: Bus, store: Store, settings: ServiceSettings, unique: str
) -> None:
    controller: ControllerService = running.by_name["controller"]
    job = await Job(bus, store, settings, f"{unique}-bad").start(controller)

    def wrong(rank: int, cmd: AdjustBatch | KillRestart, ack: Ack) -> Ack:
        if isinstance(cmd, AdjustBatch):  # rank 2 acks an older plan version
            return ack.model_copy(update={"plan_version": 0}) if rank == 2 else ack
        return [
            ack.model_copy(update={"rank": 9}),  # a rank outside the job
            ack.model_copy(update={"applied_step": cmd.checkpoint_step + 4}),  # another step
            ack.model_copy(update={"action_id": f"{job.name}-restart-0"}),  # a stale action
            ack.model_copy(update={"ok": False, "applied_step": None, "error": "disk full"}),
        ][rank]

    job.ranks.hook = wrong
    await job.adjust_then_escalate()
    await wait_for(lambda: "kill_restart" in job.kinds(), what="KILL_RESTART record")
    adjust, kill = job.records[0], job.records[-1]
    assert adjust.result == ActionResult.PARTIAL and adjust.missing_ranks == (2,)
    assert kill.result == ActionResult.FAILED and kill.acked_ranks == ()
    assert kill.error is not None
    for reason in (
        "rank 3: disk full",
        "outside the job",
        "not " + str(kill.effective_step),
        f"{job.name}-restart-0",
    ):
        assert reason in kill.error
    counts = controller.bus.rejections.counts
    assert counts[("kill_restart_ack", "bad_ack")] >= 3 and counts[("adjust_ack", "bad_ack")] >= 1
    # Nothing applied: no restart in flight, no plan for after it, the budget used once.
    ledger = await job.ledger()
    assert ledger.pending is None and ledger.count == 1
    assert (await job.plan()).version == 1
    assert len(job.records) == 2


async def test_never_restarts_a_job_it_does_not_own(
    running: RunningServices, bus: Bus, store: Store, settings: ServiceSettings, unique: str
) -> None:
    controller: ControllerService = running.by_name["controller"]
    job = await Job(bus, store, settings, f"{unique}-own").start(controller)
    await job.ranks.health(STRAGGLER, step=10, plan_version=0)
    await wait_for(lambda: controller.jobs[job.name].health is not None, what="health")
    state: JobState = controller.jobs[job.name]
    owner_key = job.keys.owner("controller", job.name)
    await store.delete(owner_key)  # another replica's world now: we no longer own it
    action = KillRestartAction(
        action_id=f"{job.name}-restart-1",
        rank=3,
        host="slot3",
        reason="test",
        local_batch_after=(32,) * 4,
    )
    view = state.view(time.time())
    record = await controller.executor.apply(state, action, view)
    assert record.result == ActionResult.FAILED  # the fence held: nothing written
    assert await store.get(job.keys.restarts(job.name)) is None
    assert await store.get(job.keys.blocklist("slot3")) is None
    controller.ownership._owned.pop(job.name, None)  # what a lease loss does
    record = await controller.executor.apply(state, replace(action), view)
    assert record.result == ActionResult.REFUSED and record.error == "job not owned by this replica"
    assert job.ranks.kills() == []
    # Only the first (still believed owned) is on ANTDT_ACTIONS: the other replica answers now.
    stored = await bus.jetstream.read(ACTION_STREAM, job.subjects.action(job.name), ActionRecord)
    assert [(r.kind, r.result) for r in stored.items] == [("kill_restart", ActionResult.FAILED)]


@pytest.mark.parametrize(("step", "result"), [(40, "applied"), (60, "partial")])
async def test_takeover_finishes_a_restart_left_in_flight(
    running: RunningServices,
    bus: Bus,
    store: Store,
    settings: ServiceSettings,
    unique: str,
    step: int,
    result: str,
) -> None:
    """A dead owner wrote the ledger (restart in flight, checkpoint 50) but recorded
    nothing: the replica that claims the job broadcasts it again while the job is before
    the checkpoint, else records what is known."""
    controller: ControllerService = running.by_name["controller"]
    job = Job(bus, store, settings, f"{unique}-left")
    spec = JobSpec(
        job=job.name,
        world_size=4,
        dataset_size=10_000_000,
        shard_size=100,
        global_batch=128,
        policy="antdt-nd",
        policy_params=PARAMS,
    )
    plan = Plan(
        job=job.name,
        version=1,
        local_batch=(39, 38, 38, 13),
        effective_step=20,
        created_at=time.time(),
    )
    pending = PendingRestart(
        action_id=f"{job.name}-restart-1",
        rank=3,
        host="slot3",
        checkpoint_step=50,
        decided_at=time.time(),
        reason="left",
        local_batch_after=(32,) * 4,
    )
    ledger = RestartLedger(
        count=1, last_decided_at=time.time(), last_checkpoint_step=50, pending=pending
    )
    job.ranks.versions = dict.fromkeys(range(4), 1)  # the ranks run plan 1 already
    for key, value in [
        (job.keys.plan(job.name), plan),
        (job.keys.restarts(job.name), ledger),
        (job.keys.spec(job.name), spec),
    ]:
        await store.put(key, value.model_dump_json().encode())
    await job.ranks.start()
    await bus.subscribe(job.subjects.action(job.name), ActionRecord, _sink(job.records))
    await wait_for(lambda: controller.ownership.owns(job.name), what="the job claimed")
    await job.ranks.health(STRAGGLER, step=step, plan_version=1)
    await wait_for(lambda: "kill_restart" in job.kinds(), what="the restart recorded")
    kill = job.records[-1]
    assert kill.action_id == f"{job.name}-restart-1" and kill.result.value == result
    assert job.records[0].action_id == f"{job.name}-plan-1"  # re-sent, recorded once
    if step < 50:
        assert {r for r, c in job.ranks.received if isinstance(c, KillRestart)} == set(range(4))
        after = await job.plan()
        assert (after.version, after.effective_step) == (2, 51)
    else:
        assert job.ranks.kills() == [] and kill.error and "checkpoint" in kill.error
        assert (await job.plan()).version == 1
    assert (await job.ledger()).count == 1


def _sink(into: list[ActionRecord]):  # type: ignore[no-untyped-def]
    async def on_record(record: ActionRecord, _: Delivery) -> None:
        into.append(record)

    return on_record
