"""Controller high availability: two replicas as separate processes against real
nats-server and etcd, a job under antdt-nd whose ranks are a test double (NATS subscribers
that ack as the agent contract says) and whose health and incidents the test publishes.
The owner is killed -9 while it waits for the acks of its ADJUST_BS; the other replica
takes the job over within the lease TTL, re-sends and records that plan, then carries out
the KILL_RESTART and measures its cost. Nothing is applied twice and nothing is lost."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.runtime.store import Store
from antdt.schemas import (
    ACTION_STREAM,
    ActionRecord,
    ActionResult,
    AdjustBatch,
    IncidentState,
    JobSpec,
    Keys,
    Plan,
    RegisterReply,
    RestartLedger,
    StragglerClass,
    Subjects,
)
from antdt.testing import FakeRanks
from tests.helpers import service_replicas, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STRAGGLER = (1000.0, 1000.0, 1000.0, 1000.0 / 3)
HEALTHY = (1000.0,) * 4
PARAMS = {"restart_cost_s": 1.0, "settle_steps": 2, "cooldown_s": 0.0}
DOWN_TICKS = 15  # the simulated restart: health stays at the checkpoint step this long


def replicas(settings: ServiceSettings, names: list[str], logs: Path) -> Any:
    """One `antdt controller` process per name; the owner must still be waiting for acks when
    it is killed, so their deadline is long."""
    return service_replicas("controller", settings, names, logs, {"ANTDT_ACK_DEADLINE_S": "30"})


class Job:
    """The simulated job: steps advance at 10 Hz, health reports the plan version in force;
    once a KILL_RESTART was acked the job stops at its checkpoint step for DOWN_TICKS
    ticks and comes back with rank 3 on a healthy spare host."""

    def __init__(self, bus: Bus, ranks: FakeRanks) -> None:
        self.bus, self.ranks = bus, ranks
        self.step, self.down, self.resumed = 0, 0, False
        self.stop = asyncio.Event()

    def plan_version(self) -> int:
        plans = [c.plan for _, c in self.ranks.received if isinstance(c, AdjustBatch)]
        return max((p.version for p in plans if p.effective_step <= self.step), default=0)

    async def run(self) -> None:
        while not self.stop.is_set():
            await self.tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 0.1)

    async def tick(self) -> None:
        kills = self.ranks.kills()
        checkpoint = kills[0].checkpoint_step if kills else None
        if checkpoint is not None and self.step == checkpoint and not self.resumed:
            self.down += 1
            if self.down >= DOWN_TICKS:  # back: rank 3 on spare slot4, no slowdown
                self.resumed = True
                await self.ranks.hello({3: "slot4"})
                await self.ranks.incident(3, "slot3", IncidentState.RESOLVED)
        else:
            self.step += 1
        hosts = {0: "slot0", 1: "slot1", 2: "slot2", 3: "slot4" if self.resumed else "slot3"}
        speeds = HEALTHY if self.resumed else STRAGGLER
        await self.ranks.health(
            speeds, step=self.step, plan_version=self.plan_version(), hosts=hosts
        )


async def watch_plans(store: Store, key: str, start: int, into: list[Plan]) -> None:
    async for event in store.watch_prefix(key, start_revision=start):
        if event.kind == "put":
            into.append(Plan.model_validate_json(event.value))


async def test_owner_killed_mid_action_survivor_finishes_the_mitigation(
    settings: ServiceSettings, bus: Bus, store: Store, unique: str, tmp_path: Path
) -> None:
    keys, subjects = Keys(settings.etcd.key_prefix), Subjects(settings.nats.subject_prefix)
    name = f"{unique}-ha"
    ranks = await FakeRanks(bus, subjects, name, 4, hold=asyncio.Event()).start()
    job = Job(bus, ranks)
    plans: list[Plan] = []
    watcher = asyncio.create_task(
        watch_plans(store, keys.plan(name), await store.current_revision() + 1, plans)
    )
    driver: asyncio.Task[None] | None = None
    names = ["controller-a", "controller-b"]
    try:
        with replicas(settings, names, tmp_path) as procs:
            spec = JobSpec(
                job=name,
                world_size=4,
                dataset_size=10_000_000,
                shard_size=100,
                global_batch=128,
                policy="antdt-nd",
                policy_params=PARAMS,
            )
            await wait_for(lambda: _register(bus, subjects, spec), timeout=60, what="register")
            owner = await wait_for(lambda: _owner(store, keys, name), what="an owner")
            await ranks.hello({r: f"slot{r}" for r in range(4)})
            driver = asyncio.create_task(job.run())
            await ranks.incident(3, "slot3", IncidentState.OPENED)
            # The owner wrote plan 1 and waits for acks that the ranks hold back: kill it.
            await wait_for(lambda: any(p.version == 1 for p in plans), what="plan 1 written")
            await wait_for(lambda: ranks.received, what="the owner's AdjustBatch")
            procs[owner].send_signal(signal.SIGKILL)
            procs[owner].wait(timeout=10)
            killed_at = time.monotonic()
            assert ranks.hold is not None
            ranks.hold.set()
            survivor = next(n for n in names if n != owner)
            await wait_for(
                lambda: _owner_is(store, keys, name, survivor),
                timeout=30,
                interval=0.05,
                what="takeover",
            )
            takeover_s = time.monotonic() - killed_at
            records = await wait_for(
                lambda: _records(bus, subjects, name, 1),
                timeout=20,
                what="plan 1 recorded by the survivor",
            )
            await ranks.incident(3, "slot3", IncidentState.ESCALATED, StragglerClass.PERSISTENT)
            await wait_for(lambda: job.resumed, timeout=60, what="KILL_RESTART done, job resumed")
            ledger = await wait_for(
                lambda: _measured(store, keys, name), timeout=20, what="restart cost measured"
            )
            records = await wait_for(lambda: _records(bus, subjects, name, 3), what="3 records")
            assert procs[survivor].poll() is None
    finally:
        job.stop.set()
        if driver is not None:
            await driver
        watcher.cancel()
    ttl = settings.etcd.lease_ttl_s
    print(f"\ntakeover after kill -9: {takeover_s:.2f}s; restart cost {ledger.costs}")
    assert takeover_s <= ttl + ttl / 2 + 1.0  # lease TTL + one claim round + etcd's tick
    ids = [r.action_id.removeprefix(name) for r in records]
    assert sorted(ids) == ["-plan-1", "-plan-2", "-restart-1"]  # none lost, none twice
    assert all(r.result == ActionResult.APPLIED for r in records), records
    # The dead owner never recorded plan 1; the survivor did, after re-sending it.
    assert records[0].action_id == f"{name}-plan-1"
    assert records[0].reason.endswith("(recorded after a takeover)")
    assert [p.version for p in plans] == [0, 1, 2]  # the plan key: each version written once
    assert plans[2].local_batch == (32,) * 4
    assert ledger.count == 1 and ledger.pending is None and len(ledger.costs) == 1
    assert set(ranks.applied.values()) == {1}  # no rank applied anything twice
    assert {a for _, a in ranks.applied} == {"plan-1", "plan-2", f"{name}-restart-1"}


async def _register(bus: Bus, subjects: Subjects, spec: JobSpec) -> bool:
    with contextlib.suppress(Exception):
        await bus.request(subjects.register(spec.job), spec, RegisterReply, timeout=1.0)
        return True
    return False


async def _owner(store: Store, keys: Keys, job: str) -> str | None:
    got = await store.get(keys.owner("controller", job))
    return got.value.decode() if got else None


async def _owner_is(store: Store, keys: Keys, job: str, name: str) -> bool:
    return await _owner(store, keys, job) == name


async def _records(bus: Bus, subjects: Subjects, job: str, n: int) -> list[ActionRecord] | None:
    replay = await bus.jetstream.read(ACTION_STREAM, subjects.action(job), ActionRecord)
    return replay.items if len(replay.items) >= n else None


async def _measured(store: Store, keys: Keys, job: str) -> RestartLedger | None:
    got = await store.get_model(keys.restarts(job), RestartLedger)
    return got[0] if got and got[0].costs else None
