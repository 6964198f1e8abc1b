"""The three service shells against real nats-server and etcd: registration, shards,
ownership, and bad input on every subject (rejected, counted, service keeps running)."""

from __future__ import annotations

import json
import time

import pytest

from antdt.runtime.bus import Bus, RequestRefused
from antdt.runtime.config import ServiceSettings
from antdt.runtime.coordination.jobs import live_jobs
from antdt.runtime.store import Store
from antdt.schemas import (
    ExitReason,
    FetchStatus,
    JobHealth,
    JobSpec,
    Keys,
    Plan,
    PlanRequest,
    RankExit,
    RankHello,
    RankState,
    RegisterReply,
    ShardFetch,
    ShardReply,
    ShardStatus,
    ShardStatusRequest,
    StepEvent,
    Subjects,
)
from antdt.services.monitor.lifecycle import JobPhase
from antdt.services.monitor.service import MonitorSettings
from antdt.services.runner import start_service
from tests.e2e.conftest import RunningServices, start_services
from tests.helpers import monitor_owner, refusal, step_event, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
async def running(settings):  # type: ignore[no-untyped-def]
    services = await start_services(settings, window=4, health_interval_s=0.2)
    yield services
    await services.runtime.shutdown()


def spec(job: str, **kw: object) -> JobSpec:
    fields: dict = dict(job=job, world_size=2, dataset_size=50, shard_size=10, global_batch=8)
    fields.update(kw)
    return JobSpec(**fields)


def step(job: str, rank: int, n: int, compute: float = 0.1) -> StepEvent:
    return step_event(job, rank, n, compute_s=compute)


async def test_register_is_idempotent_and_plan_served(running: RunningServices, bus: Bus) -> None:
    subjects = Subjects(bus.settings.subject_prefix)
    first = await bus.request(subjects.register("j1"), spec("j1"), RegisterReply)
    again = await bus.request(subjects.register("j1"), spec("j1", global_batch=6), RegisterReply)
    assert first.created and not again.created
    assert again.spec.global_batch == 8 and again.plan.local_batch == (4, 4)
    plan = await bus.request(subjects.plan_get("j1"), PlanRequest(job="j1", rank=0), Plan)
    assert plan.version == 0
    with pytest.raises(RequestRefused, match="unknown_job"):
        await bus.request(subjects.plan_get("nope"), PlanRequest(job="nope", rank=0), Plan)
    with pytest.raises(RequestRefused, match="bad_request"):
        await bus.request(subjects.register("other"), spec("j1"), RegisterReply)
    with pytest.raises(RequestRefused):
        await bus.request(subjects.register("j2"), spec("j2", policy="nonexistent"), RegisterReply)
    controller = running.by_name["controller"]
    await wait_for(lambda: controller.ownership.owns("j1"), what="controller owns j1")


async def test_shards_fetch_done_and_bad_input(running: RunningServices, bus: Bus) -> None:
    subjects = Subjects(bus.settings.subject_prefix)
    fetch = subjects.shards("j3", "fetch")
    with pytest.raises(RequestRefused, match="unknown_job"):
        await bus.request(fetch, ShardFetch(job="j3", rank=0, epoch=0), ShardReply)
    await bus.request(subjects.register("j3"), spec("j3"), RegisterReply)
    reply = await bus.request(fetch, ShardFetch(job="j3", rank=0, epoch=0, want=2), ShardReply)
    assert reply.status == FetchStatus.OK and len(reply.grants) == 2
    bad_inputs = [
        b"not json",
        b'{"job": "j3", "rank": 0, "epoch": 0, "surprise": 1}',
        b'{"job": "j3", "rank": -1, "epoch": 0}',
        json.dumps({"job": "other", "rank": 0, "epoch": 0}).encode(),
        ShardFetch(job="j3", rank=1, epoch=0, done=(reply.grants[0].ref(),))
        .model_dump_json()
        .encode(),
        ShardFetch(job="j3", rank=0, epoch=7).model_dump_json().encode(),
    ]
    before = await bus.request(
        subjects.shards("j3", "status"), ShardStatusRequest(job="j3"), ShardStatus
    )
    for raw in bad_inputs:
        answer = await refusal(bus, fetch, raw, ShardReply)
        assert answer.code in {"bad_request", "fenced", "stale"}, answer
        assert answer.error
    after = await bus.request(
        subjects.shards("j3", "status"), ShardStatusRequest(job="j3"), ShardStatus
    )
    assert after == before  # nothing changed in the ledger
    done = tuple(g.ref() for g in reply.grants)
    ok = await bus.request(
        fetch, ShardFetch(job="j3", rank=0, epoch=0, done=done, want=0), ShardReply
    )
    assert ok.status == FetchStatus.OK
    status = await bus.request(
        subjects.shards("j3", "status"), ShardStatusRequest(job="j3"), ShardStatus
    )
    assert status.done == 2 and status.in_flight == ()


async def test_monitor_rejects_bad_steps_and_keeps_running(
    running: RunningServices, bus: Bus
) -> None:
    subjects = Subjects(bus.settings.subject_prefix)
    await bus.request(subjects.register("j4"), spec("j4"), RegisterReply)
    monitor = running.by_name["monitor"]
    await monitor_owner(monitor.store, Keys(monitor.settings.etcd.key_prefix), "j4")
    healths: list[JobHealth] = []

    async def on_health(h: JobHealth, _: object) -> None:
        healths.append(h)

    await bus.subscribe(subjects.health("j4"), JobHealth, on_health)
    good = step("j4", 0, 1)
    for raw in [
        b"{garbage",
        b'{"compute_s": NaN}',
        json.dumps({**good.model_dump(), "compute_s": -1.0}).encode(),
        json.dumps({**good.model_dump(), "step_s": 0.0}).encode(),
        json.dumps({**good.model_dump(), "extra": True}).encode(),
        b"x" * 300_000,
    ]:
        await bus.publish_raw(subjects.step("j4", 0), raw)
    await bus.publish(subjects.step("j4", 1), good)  # rank in payload ≠ subject
    await wait_for(lambda: monitor.bus.rejections.total() >= 7, what="7 rejections")
    for n in range(12):
        for rank in (0, 1):
            await bus.publish(subjects.step("j4", rank), step("j4", rank, n))
    await wait_for(lambda: monitor.ingested >= 24, what="valid steps ingested after bad ones")
    await wait_for(lambda: any(h.ranks for h in healths), what="health with ranks")
    assert not monitor.detectors["j4"].open_incidents


async def test_an_ended_job_is_given_up_and_registering_it_again_makes_it_live(
    running: RunningServices, bus: Bus, settings: ServiceSettings
) -> None:
    """Both ranks of j5 finish: the monitor stores the job's end and, like the controller,
    gives the job up. Its late steps reach no replica (none subscribes to them any more),
    and a late exit, which reaches both, claims nothing: the replica that ended it drops
    it, the other finds the end in etcd. Registering j5 again (a new run) deletes the end,
    and the services take the job on again."""
    subjects, keys = Subjects(bus.settings.subject_prefix), Keys(settings.etcd.key_prefix)
    monitor, controller = running.by_name["monitor"], running.by_name["controller"]
    other = await start_service(
        "monitor",
        MonitorSettings(**{**settings.model_dump(), "replica_id": "monitor-2"}),
        running.runtime,
    )
    store = monitor.store
    await bus.request(subjects.register("j5"), spec("j5"), RegisterReply)
    await monitor_owner(store, keys, "j5")
    await _steps(bus, subjects, range(3))
    await wait_for(lambda: "j5" in monitor.detectors or "j5" in other.detectors)
    for rank in range(2):
        await bus.publish(subjects.exit("j5", rank), finished("j5", rank, step=2))
    end = await wait_for(lambda: store.get(keys.ended("j5")), what="the job's end stored")
    assert {r.state for r in JobHealth.model_validate_json(end.value).ranks} == {RankState.EXITED}
    for service in ("monitor", "controller"):
        owner = keys.owner(service, "j5")
        await wait_for(lambda o=owner: _absent(store, o), what=f"the {service} gives j5 up")

    async def late_exit_dropped_by_both() -> bool:
        await _steps(bus, subjects, range(1, 2))
        # Every claim try is at most once a second: sent until both have seen one.
        await bus.publish(subjects.exit("j5", 0), finished("j5", 0, step=2))
        return all(m.book.phase("j5") is JobPhase.ENDED for m in (monitor, other))

    await wait_for(late_exit_dropped_by_both, timeout=10, interval=0.3, what="late exit dropped")
    assert "j5" not in monitor.intake.watched and "j5" not in other.intake.watched
    assert not monitor.detectors.get("j5") and not other.detectors.get("j5")
    assert await _absent(store, keys.owner("monitor", "j5"))
    assert "j5" not in await live_jobs(store, keys) and "j5" not in await controller._claimable()

    again = await bus.request(subjects.register("j5"), spec("j5"), RegisterReply)
    assert not again.created and await _absent(store, keys.ended("j5"))
    await wait_for(lambda: controller.ownership.owns("j5"), what="the controller owns j5 again")
    hello = RankHello(job="j5", rank=0, world_size=2, host="h0", pid=3, started_at=time.time())
    await bus.publish(subjects.hello("j5", 0), hello)
    await monitor_owner(store, keys, "j5")
    await _steps(bus, subjects, range(3))  # the new run steps from 0 again
    await wait_for(
        lambda: "j5" in monitor.detectors or "j5" in other.detectors,
        what="a monitor watches j5 again",
    )


async def test_exits_end_a_job_though_they_come_with_or_before_its_first_step(
    running: RunningServices, bus: Bus, settings: ServiceSettings
) -> None:
    """Exits come on their own subscription and may overtake a job's first step, which
    takes the job on (etcd reads); and a job's ranks may exit before any step (a crash at
    start). Either way the job ends at once, not `abandon_after_s` later."""
    subjects, keys = Subjects(bus.settings.subject_prefix), Keys(settings.etcd.key_prefix)
    store = running.by_name["monitor"].store
    for job in ("raced", "stepless"):
        await bus.request(subjects.register(job), spec(job), RegisterReply)
    await monitor_owner(store, keys, "raced")  # claimed, its first step not yet taken on
    for rank in range(2):  # one step each, the exits right behind it
        await bus.publish(subjects.step("raced", rank), step("raced", rank, 0))
    for rank in range(2):
        await bus.publish(subjects.exit("raced", rank), finished("raced", rank, step=0))
        await bus.publish(subjects.exit("stepless", rank), finished("stepless", rank, step=0))
    for job in ("raced", "stepless"):
        end = await wait_for(lambda j=job: store.get(keys.ended(j)), what=f"{job} ended")
        ranks = JobHealth.model_validate_json(end.value).ranks
        assert [r.state for r in ranks] == [RankState.EXITED] * 2


def finished(job: str, rank: int, step: int) -> RankExit:
    return RankExit(
        job=job,
        rank=rank,
        host=f"h{rank}",
        pid=1,
        reason=ExitReason.FINISHED,
        step=step,
        at=time.time(),
    )


async def _steps(bus: Bus, subjects: Subjects, steps: range) -> None:
    for n in steps:
        for rank in range(2):
            await bus.publish(subjects.step("j5", rank), step("j5", rank, n))
    await bus.flush()


async def _absent(store: Store, key: str) -> bool:
    return await store.get(key) is None


async def test_messages_of_unregistered_jobs_claim_nothing_and_are_not_remembered(
    running: RunningServices, bus: Bus, settings: ServiceSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Job ids come off the wire: hellos, exits and steps naming jobs nobody registered
    (a typo, a stray publisher) must not make the monitor own them (owner keys, ownership
    slots, claim rounds, step subscriptions) nor grow what it remembers per job."""
    subjects, keys = Subjects(bus.settings.subject_prefix), Keys(settings.etcd.key_prefix)
    monitor = running.by_name["monitor"]
    monkeypatch.setattr(monitor.book, "limit", 8)  # MAX_REMEMBERED, made small
    # A job claimed on a hello waits for its registration (hello comes first): not long.
    monkeypatch.setattr("antdt.services.monitor.lifecycle.REGISTER_WAIT_S", 0.5)
    store = monitor.store
    junk = [f"stray{i}" for i in range(20)]
    for job in junk:
        hello = RankHello(job=job, rank=0, world_size=2, host="h0", pid=3, started_at=time.time())
        await bus.publish(subjects.hello(job, 0), hello)
        await bus.publish(subjects.exit(job, 0), finished(job, 0, step=1))
        await bus.publish(subjects.step(job, 0), step(job, 0, 1))
    # Registered jobs behind them, on the same subscriptions: once these are taken on,
    # every stray message before them was handled.
    for job in ("by-hello", "by-exit"):
        await bus.request(subjects.register(job), spec(job), RegisterReply)
    hello = RankHello(job="by-hello", rank=0, world_size=2, host="h0", pid=3, started_at=0.0)
    await bus.publish(subjects.hello("by-hello", 0), hello)
    await bus.publish(subjects.exit("by-exit", 0), finished("by-exit", 0, step=1))
    await wait_for(lambda: monitor.ownership.owns("by-hello"), what="claimed on its hello")
    await wait_for(lambda: "by-exit" in monitor.detectors, what="taken on by its exit")

    async def only_registered_owned() -> bool:
        owned = await store.get_prefix(keys.owners("monitor"), keys_only=True)
        return sorted(o.key for o in owned) == [
            keys.owner("monitor", "by-exit"),
            keys.owner("monitor", "by-hello"),
        ]

    await wait_for(only_registered_owned, what="the stray jobs' claims given up")
    assert monitor.book.count(JobPhase.STARTING) == 0
    assert set(monitor.detectors) <= {"by-hello", "by-exit"}
    assert monitor.intake.watched == ["by-exit", "by-hello"]
    # The stray jobs' records: at most 8 (IDLE), beside the two jobs owned.
    assert monitor.book.count(JobPhase.IDLE) <= 8 and len(monitor.book) <= 8 + 2
    assert await live_jobs(store, keys) == ["by-exit", "by-hello"]


async def test_a_job_claimed_on_a_hello_before_it_registers_is_kept_once_it_does(
    running: RunningServices, bus: Bus, settings: ServiceSettings
) -> None:
    """An agent says hello, then registers: the monitor claims the job on the hello
    (and subscribes to its steps) and keeps it when the spec comes, so the steps right
    after registration are ingested, not lost until a claim round."""
    subjects = Subjects(bus.settings.subject_prefix)
    monitor = running.by_name["monitor"]
    hello = RankHello(job="early", rank=0, world_size=2, host="h0", pid=3, started_at=time.time())
    await bus.publish(subjects.hello("early", 0), hello)
    await wait_for(lambda: monitor.ownership.owns("early"), what="claimed on its hello")
    # Held as starting once the claim has read that the job has no end and no spec yet
    # (two etcd reads after the claim itself).
    await wait_for(
        lambda: monitor.book.phase("early") is JobPhase.STARTING, what="held as starting"
    )
    assert monitor.intake.watched == ["early"]
    await bus.request(subjects.register("early"), spec("early"), RegisterReply)
    for n in range(3):
        for rank in (0, 1):
            await bus.publish(subjects.step("early", rank), step("early", rank, n))
    await wait_for(lambda: monitor.ingested >= 6, what="its first steps ingested")
    await wait_for(
        lambda: monitor.book.phase("early") is JobPhase.WATCHED, what="registered: held for good"
    )
    assert monitor.ownership.owns("early") and monitor.dropped_not_owner == 0
