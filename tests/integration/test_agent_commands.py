"""Registration and command handling of the agent over the real nats-server, against the
real controller and shards services (ledger and specs in the real etcd). Commands are
sent by the test itself, as a client of the agent's command subjects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from antdt.agent import Agent, AgentError
from antdt.runtime.bus import Bus, Delivery, RequestRefused
from antdt.runtime.config import NatsSettings, ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.servers import free_port
from antdt.runtime.store import Store
from antdt.schemas import (
    Ack,
    AdjustBatch,
    JobSpec,
    Keys,
    KillRestart,
    Plan,
    RankHello,
    RegisterReply,
    Subjects,
)
from antdt.services.runner import settings_class, start_service
from tests.e2e.conftest import RunningServices
from tests.helpers import wait_for
from tests.integration.agent_fixtures import (
    ThreadCollectives,
    agent_settings,
    close_all,
    real_services,
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def services(settings: ServiceSettings) -> AsyncIterator[RunningServices]:
    async with real_services(settings) as running:
        yield running


@pytest.fixture
async def agents_to_close() -> Any:
    started: list[Agent] = []
    yield started
    await asyncio.to_thread(close_all, started)


def plan(job: str, version: int, batch: tuple[int, ...], effective: int) -> Plan:
    return Plan(
        job=job,
        version=version,
        local_batch=batch,
        effective_step=effective,
        created_at=time.time(),
    )


def adjust(job: str, p: Plan, action: str = "a1") -> AdjustBatch:
    return AdjustBatch(action_id=action, job=job, plan=p)


async def start(cfg: Any, started: list[Agent]) -> Agent:
    agent = Agent(cfg, collectives=ThreadCollectives(cfg.world_size).rank(cfg.rank))
    started.append(agent)
    return await asyncio.to_thread(agent.start)


async def test_hello_register_and_stored_spec_wins(
    services: RunningServices,
    settings: ServiceSettings,
    unique: str,
    bus: Bus,
    store: Store,
    agents_to_close: list[Agent],
) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    hellos: list[RankHello] = []
    asked: list[JobSpec] = []

    async def on_hello(hello: RankHello, _: Delivery) -> None:
        hellos.append(hello)

    async def on_register(spec: JobSpec, _: Delivery) -> None:
        asked.append(spec)  # listens only: the controller answers

    await bus.subscribe(subjects.hello(unique, "*"), RankHello, on_hello)
    await bus.subscribe(subjects.register(unique), JobSpec, on_register)
    await bus.flush()
    first = JobSpec(job=unique, world_size=2, dataset_size=80, shard_size=8, global_batch=6, seed=9)
    assert (await bus.request(subjects.register(unique), first, RegisterReply)).created
    agent = await start(
        agent_settings(settings.nats, unique, 1, 2, max_local_batch=64), agents_to_close
    )
    assert agent.spec is not None and (agent.spec.dataset_size, agent.spec.seed) == (80, 9)
    assert agent.plan.local_batch == (3, 3) and agent.plan.version == 0
    await wait_for(lambda: len(asked) == 2, what="the rank's registration")
    assert asked[-1].dataset_size == 50  # what the rank asked for
    stored = await store.get_model(Keys(settings.etcd.key_prefix).spec(unique), JobSpec)
    assert stored is not None and stored[0] == first  # the first registration stays
    await wait_for(lambda: hellos, what="hello")
    assert (hellos[0].rank, hellos[0].host, hellos[0].max_local_batch) == (1, "h1", 64)


async def test_register_failures_are_clear(
    settings: ServiceSettings, unique: str, bus: Bus, agents_to_close: list[Agent]
) -> None:
    nowhere = NatsSettings(url=f"nats://127.0.0.1:{free_port()}", connect_timeout_s=0.2)
    with pytest.raises(AgentError, match="cannot connect to NATS"):
        await start(agent_settings(nowhere, unique, 0, 1, register_timeout_s=0.5), agents_to_close)
    with pytest.raises(AgentError, match="could not register"):
        await start(
            agent_settings(settings.nats, unique, 0, 1, register_timeout_s=0.5), agents_to_close
        )

    async with real_services(settings):
        register = Subjects(settings.nats.subject_prefix).register(unique)
        four = JobSpec(job=unique, world_size=4, dataset_size=50, shard_size=4, global_batch=8)
        assert (await bus.request(register, four, RegisterReply)).created
        with pytest.raises(AgentError, match="registered with 4 ranks"):
            await start(agent_settings(settings.nats, unique, 0, 2), agents_to_close)

        cfg = agent_settings(settings.nats, f"{unique}-p", 0, 1, policy="nope")
        with pytest.raises(AgentError, match="unknown policy 'nope'"):
            await start(cfg, agents_to_close)


async def test_adjust_batch_acks_refusals_and_plan_switch(
    services: RunningServices,
    settings: ServiceSettings,
    unique: str,
    bus: Bus,
    agents_to_close: list[Agent],
) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    cfg = agent_settings(settings.nats, unique, 0, 1, dataset_size=200, global_batch=5)
    agent = await start(cfg, agents_to_close)
    cmd = subjects.command(unique, 0)

    ack = await bus.request(cmd, adjust(unique, plan(unique, 1, (3,), effective=2)), Ack)
    assert (ack.ok, ack.applied_step, ack.plan_version, ack.rank) == (True, 2, 1, 0)
    again = await bus.request(cmd, adjust(unique, plan(unique, 1, (3,), effective=2), "a1"), Ack)
    assert again.ok and again.applied_step == 2  # same version: idempotent

    with pytest.raises(RequestRefused) as stale:
        await bus.request(cmd, adjust(unique, plan(unique, 0, (4,), effective=9)), Ack)
    assert stale.value.reply.code == "stale" and "older than 1" in stale.value.reply.error
    with pytest.raises(RequestRefused) as wrong_world:
        await bus.request(cmd, adjust(unique, plan(unique, 2, (3, 3), effective=0)), Ack)
    assert wrong_world.value.reply.code == "bad_request"
    assert "2 local batches for a job of 1 ranks" in wrong_world.value.reply.error
    with pytest.raises(RequestRefused) as other_job:
        await bus.request(cmd, adjust("other", plan("other", 2, (3,), effective=0)), Ack)
    assert other_job.value.reply.code == "bad_request"

    epochs = agent.epochs()
    assert await asyncio.to_thread(next, epochs) == 0
    steps = agent.steps()

    def run(n: int) -> list[int]:
        batches = []
        for _ in range(n):
            step = next(steps)
            batches.append(len(step.sample_ids))
            step.sync(object())
        return batches

    assert await asyncio.to_thread(run, 4) == [5, 5, 3, 3]  # v1 from its effective step 2
    # A plan whose effective step has passed applies at the next step to start (4).
    late = await bus.request(
        subjects.command_all(unique), adjust(unique, plan(unique, 2, (7,), effective=0), "a2"), Ack
    )
    assert (late.ok, late.applied_step, late.plan_version) == (True, 4, 2)
    assert await asyncio.to_thread(run, 2) == [7, 7]
    assert agent.commands == 6
    await asyncio.to_thread(agent.close)


async def test_kill_restart_is_acked_by_a_restartable_rank_and_falls_due_at_its_step(
    services: RunningServices,
    settings: ServiceSettings,
    unique: str,
    bus: Bus,
    agents_to_close: list[Agent],
) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    agent = await start(agent_settings(settings.nats, unique, 0, 1), agents_to_close)
    kill = KillRestart(action_id="k1", job=unique, rank=0, checkpoint_step=10, avoid_hosts=("h0",))
    refused = await bus.request(subjects.command(unique, 0), kill, Ack)
    assert not refused.ok and "checkpoint" in (refused.error or "")  # the script cannot
    agent.restartable = True
    for subject in (subjects.command(unique, 0), subjects.command_all(unique)):
        ack = await bus.request(subject, kill, Ack)  # a repeat is acked again
        assert ack.ok and ack.applied_step == 10
    other = await bus.request(
        subjects.command(unique, 0), kill.model_copy(update={"action_id": "k2"}), Ack
    )
    assert not other.ok and "pending" in (other.error or "")
    assert not agent.restart_due(9) and agent.restart_due(10)
    bad = await bus.request(
        subjects.command(unique, 0), kill.model_copy(update={"rank": 3, "action_id": "k3"}), Ack
    )
    assert not bad.ok and "outside" in (bad.error or "")
    await asyncio.to_thread(agent.close)


async def test_the_controller_knows_each_rank_from_its_hello_sent_before_registering(
    settings: ServiceSettings, unique: str, agents_to_close: list[Agent]
) -> None:
    """An agent says hello and then registers: on a new job the hello arrives before any
    replica owns the job (registration claims it). Its host and memory cap must still
    reach the job's state, or a plan could give the rank more than its memory holds. A
    replica that takes the job over must know them as well, even one started after the
    hellos (a rolling upgrade of the controllers)."""
    runtimes = [ServiceRuntime(f"controller-{i}") for i in range(3)]
    controllers = [
        await start_service("controller", _replica(settings, f"c{i}"), runtime)
        for i, runtime in enumerate(runtimes[:2])
    ]
    said = ({0: 64, 1: 32}, {0: "h0", 1: "h1"})
    try:
        for rank, cap in ((0, 64), (1, 32)):
            await start(
                agent_settings(settings.nats, unique, rank, 2, max_local_batch=cap), agents_to_close
            )
        owner = await wait_for(
            lambda: next((c for c in controllers if unique in c.jobs), None), what="the job's state"
        )
        state = owner.jobs[unique]
        assert (state.memory_caps, state.hosts) == said
        heir = controllers[1 - controllers.index(owner)]
        await runtimes[controllers.index(owner)].shutdown()  # revokes its lease
        await wait_for(lambda: heir.ownership.owns(unique), timeout=30, what="the takeover")
        state = await heir._state(unique)
        assert (state.memory_caps, state.hosts) == said
        await runtimes[controllers.index(heir)].shutdown()
        late = await start_service("controller", _replica(settings, "c2"), runtimes[2])
        await wait_for(lambda: late.ownership.owns(unique), timeout=30, what="a late replica")
        state = await late._state(unique)
        assert (state.memory_caps, state.hosts) == said  # from etcd
    finally:
        for runtime in runtimes:
            await runtime.shutdown()


def _replica(settings: ServiceSettings, replica_id: str) -> Any:
    return settings_class("controller")(**{**settings.model_dump(), "replica_id": replica_id})
