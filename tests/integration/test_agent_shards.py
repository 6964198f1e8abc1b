"""The agent's shard stream against the real shards service (ledger in the real etcd) and
the real controller, over the real nats-server: spanning batches, done-after-sync, epochs,
PENDING/EPOCH_DONE/JOB_DONE, the shards service going away and coming back, a nats-server
restart, and exact-once sample accounting over several ranks.

What the agents and the service said to each other is read off the wire by a passive tap
(tests.integration.agent_fixtures.ShardsTap); it never answers."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from antdt.agent import Agent, AgentClosed, AgentSettings
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import NatsSettings, ServiceSettings
from antdt.runtime.servers import EmbeddedCluster, EmbeddedNats, ServerError
from antdt.schemas import (
    EpochFinished,
    FetchStatus,
    ReleaseReply,
    ShardFetch,
    ShardRelease,
    ShardReply,
    ShardsReturned,
    StepEvent,
    Subjects,
)
from tests.e2e.conftest import RunningServices, start_services
from tests.helpers import wait_for
from tests.integration.agent_fixtures import (
    NullCollectives,
    ShardsTap,
    ThreadCollectives,
    agent_settings,
    assert_exactly_once,
    close_all,
    read_sample_log,
    real_services,
    run_ranks,
    shard_status,
    start_all,
    start_only,
    train,
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def services(settings: ServiceSettings) -> AsyncIterator[RunningServices]:
    """The three real services for the whole test."""
    async with real_services(settings) as running:
        yield running


@pytest.fixture
async def to_stop() -> AsyncIterator[list[RunningServices]]:
    """Services a test starts (and may stop and start again) itself: shut down after it."""
    started: list[RunningServices] = []
    yield started
    for running in reversed(started):
        await running.runtime.shutdown()  # idempotent


@pytest.fixture
async def agents_to_close() -> Any:
    """Agents registered here are closed after the test, whatever happened in it."""
    started: list[Agent] = []
    yield started
    await asyncio.to_thread(close_all, started)


def start_one(cfg: AgentSettings, started: list[Agent]) -> Agent:
    agent = Agent(cfg, collectives=ThreadCollectives(1).rank(0))
    started.append(agent)
    return agent.start()


async def in_flight(bus: Bus, job: str) -> set[tuple[int, int]]:
    """(rank, shard) pairs the ledger has handed out and not yet seen done."""
    return {(e.rank, e.shard) for e in (await shard_status(bus, job)).in_flight}


# -- tests -----------------------------------------------------------------------------


async def test_three_ranks_two_epochs_every_sample_once(
    services: RunningServices,
    settings: ServiceSettings,
    unique: str,
    bus: Bus,
    tmp_path: Path,
    agents_to_close: list[Agent],
) -> None:
    tap = await ShardsTap(bus, unique).attach()
    world, prefix = 3, tmp_path / "samples"
    coll = ThreadCollectives(world)
    configs = [
        agent_settings(settings.nats, unique, r, world, epochs=2, sample_log=str(prefix))
        for r in range(world)
    ]
    agents = [Agent(c, collectives=coll.rank(c.rank)) for c in configs]
    agents_to_close.extend(agents)
    await asyncio.to_thread(start_all, agents)
    seen = await asyncio.to_thread(run_ranks, agents)
    await asyncio.to_thread(close_all, agents)
    # Same global step sequence on every rank, continuing across epochs.
    assert seen[0] == seen[1] == seen[2]
    assert [s for _, s in seen[0]] == list(range(len(seen[0])))
    assert {e for e, _ in seen[0]} == {0, 1}
    assert_exactly_once(read_sample_log(prefix, world), 50, epochs=2)
    ledger = await shard_status(bus, unique)  # the last epoch, complete
    assert (ledger.epoch, ledger.num_shards, ledger.done, ledger.todo) == (1, 13, 13, 0)
    assert not ledger.in_flight
    await wait_for(lambda: len(tap.done_refs()) == 2 * 13, what="every done on the wire")
    for rank in range(world):  # each rank ran out of epoch 0, then learnt the job was done
        statuses = tap.statuses(rank)
        assert statuses[FetchStatus.EPOCH_DONE] >= 1 and statuses[FetchStatus.JOB_DONE] >= 1
    assert all(a.dropped_events == 0 for a in agents)


async def test_the_next_epoch_waits_for_a_rank_still_holding_shards(
    services: RunningServices,
    settings: ServiceSettings,
    unique: str,
    bus: Bus,
    tmp_path: Path,
    agents_to_close: list[Agent],
) -> None:
    """Two ranks training on their own (no collectives between them): rank 1 stops
    mid-epoch holding shards, so rank 0, out of epoch 0, is told they are still held
    (its settle requests answered with `outstanding`) until rank 1 has finished; then
    both train epoch 1."""
    tap = await ShardsTap(bus, unique).attach()
    prefix = tmp_path / "pending"
    shape = {"dataset_size": 40, "global_batch": 4, "epochs": 2, "sample_log": str(prefix)}
    configs = [agent_settings(settings.nats, unique, r, 2, **shape) for r in range(2)]
    agents = [Agent(c, collectives=NullCollectives()) for c in configs]
    agents_to_close.extend(agents)
    await asyncio.to_thread(start_all, agents)
    paused, resume = threading.Event(), threading.Event()
    in_epoch_1 = [threading.Event(), threading.Event()]

    def hook(rank: int) -> Callable[[Any], None]:
        def on_step(step: Any) -> None:
            if rank == 1 and (step.epoch, step.index) == (0, 1):  # stop, holding shards
                paused.set()
                resume.wait(30)
            elif step.epoch == 1 and not in_epoch_1[rank].is_set():
                # Whoever gets to epoch 1 first leaves the other a share of it.
                in_epoch_1[rank].set()
                in_epoch_1[1 - rank].wait(30)

        return on_step

    def waits() -> list[int]:
        pairs = tap.answered(0)
        return [i for i, (f, r) in enumerate(pairs) if f.settle and r.outstanding]

    training = asyncio.ensure_future(asyncio.to_thread(run_ranks, agents, [hook(0), hook(1)]))
    try:
        await wait_for(paused.is_set, what="rank 1 paused")
        await wait_for(lambda: len(waits()) >= 2, what="rank 0 told to wait")
        assert agents[0].epoch == 0 and not training.done()  # rank 0 waits in epoch 0
        held = await in_flight(bus, unique)
        assert held and {rank for rank, _ in held} == {1}
    finally:
        resume.set()
    seen = await asyncio.wait_for(training, 30)
    await asyncio.to_thread(close_all, agents)
    assert_exactly_once(read_sample_log(prefix, 2), 40, epochs=2)
    assert all({e for e, _ in ranks} == {0, 1} for ranks in seen)
    # Rank 0 was told to wait, without grants, until epoch 0 was finished; then it asked
    # for epoch 1 and was granted shards of it at once.
    pairs = tap.answered(0)
    told = waits()
    assert all(pairs[i][1].epoch == 0 and not pairs[i][1].grants for i in told)
    fetch, last = pairs[told[-1] + 1]
    assert fetch.settle and (last.status, last.outstanding) == (FetchStatus.EPOCH_DONE, 0)
    fetch, after = pairs[told[-1] + 2]
    assert fetch.epoch == 1 and (after.epoch, after.status) == (1, FetchStatus.OK) and after.grants
    assert all(tap.statuses(rank)[FetchStatus.JOB_DONE] >= 1 for rank in range(2))


async def test_batches_span_shards_and_done_waits_for_sync(
    services: RunningServices,
    settings: ServiceSettings,
    unique: str,
    bus: Bus,
    agents_to_close: list[Agent],
) -> None:
    tap = await ShardsTap(bus, unique).attach()
    cfg = agent_settings(settings.nats, unique, 0, 1, dataset_size=20, global_batch=6, prefetch=2)
    agent = await asyncio.to_thread(start_one, cfg, agents_to_close)
    epochs = agent.epochs()
    assert await asyncio.to_thread(next, epochs) == 0
    steps = agent.steps()
    step = await asyncio.to_thread(next, steps)
    await wait_for(tap.answered, what="the first grants on the wire")
    first, second = tap.answered()[0][1].grants  # the service's shuffled order
    # All 4 ids of the first shard and 2 of the second (in its own order): the batch spans.
    ids = step.sample_ids
    assert len(set(ids)) == 6 and set(ids[:4]) == set(range(first.start, first.end))
    assert set(ids[4:]) < set(range(second.start, second.end))
    # The first shard is used up and the 2 samples left last less than two takes: the
    # agent refills its prefetch before the step syncs, and that request must not report
    # the shard yet.
    await wait_for(lambda: len(tap.answered()) >= 2, what="refill fetch")
    assert tap.fetches[1].want == 1
    assert all(not f.done for f in tap.fetches) and (0, first.shard) in await in_flight(bus, unique)
    await asyncio.to_thread(step.sync, object())
    await wait_for(tap.done_refs, what="done after sync")
    assert [r.shard for r in tap.done_refs()] == [first.shard]
    assert (0, second.shard) in await in_flight(bus, unique)  # only half consumed
    rest = await asyncio.to_thread(lambda: [s.sample_ids for s in _sync_all(steps)])
    assert sorted(step.sample_ids + [i for ids in rest for i in ids]) == list(range(20))
    assert [len(ids) for ids in rest] == [6, 6, 2]  # the tail is short
    assert await asyncio.to_thread(lambda: list(epochs)) == []  # JOB_DONE ends epochs()
    await asyncio.to_thread(agent.close)
    await wait_for(lambda: len(tap.done_refs()) == 5, what="every shard done")
    assert sorted(r.shard for r in tap.done_refs()) == list(range(5))
    assert tap.statuses()[FetchStatus.JOB_DONE] >= 1


@pytest.mark.parametrize(("step_s", "shards"), [(0.001, 100), (0.03, 20)])
async def test_one_request_per_shard_reports_it_done_and_asks_for_the_next(
    services: RunningServices,
    settings: ServiceSettings,
    unique: str,
    bus: Bus,
    agents_to_close: list[Agent],
    step_s: float,
    shards: int,
) -> None:
    # Shards of 40 samples, batches of 8 (a shard lasts 5 steps): in steady state the shard
    # a step finished is reported, once synced, in the request for its successor, not in a
    # request of its own (DLRover's two RPCs per shard). With 30 ms steps a shard lasts
    # longer than the service takes to write its done mark: no request only to confirm it.
    tap = await ShardsTap(bus, unique).attach()
    cfg = agent_settings(
        settings.nats,
        unique,
        0,
        1,
        dataset_size=40 * shards,
        shard_size=40,
        global_batch=8,
        prefetch=2,
    )
    agent = await asyncio.to_thread(start_one, cfg, agents_to_close)
    seen = await asyncio.to_thread(train, agent, lambda step: time.sleep(step_s))
    await asyncio.to_thread(agent.close)
    assert len(seen) == 5 * shards
    await wait_for(lambda: len(tap.done_refs()) == shards, what="every shard done")
    both = [f for f in tap.fetches if f.done and f.want > 0]
    assert len(both) >= shards - 5, f"{len(tap.fetches)} requests, {len(both)} done and want"
    assert len(tap.fetches) <= shards + 5  # the first, one per shard, the epoch's end


def _sync_all(steps: Iterator[Any]) -> Iterator[Any]:
    for step in steps:
        step.sync(object())
        yield step


async def test_survives_the_shards_service_disappearing(
    settings: ServiceSettings,
    unique: str,
    bus: Bus,
    tmp_path: Path,
    to_stop: list[RunningServices],
    agents_to_close: list[Agent],
) -> None:
    to_stop.append(await start_only(settings, "monitor", "controller"))
    to_stop.append(shards := await start_only(settings, "shards"))
    prefix = tmp_path / "outage"
    cfg = agent_settings(
        settings.nats, unique, 0, 1, dataset_size=60, global_batch=2, sample_log=str(prefix)
    )
    agent = await asyncio.to_thread(start_one, cfg, agents_to_close)
    loop = asyncio.get_running_loop()
    went_away = threading.Event()

    def on_step(step: Any) -> None:
        if step.index == 3:  # stop the service mid-epoch, from the training thread
            asyncio.run_coroutine_threadsafe(shards.runtime.shutdown(), loop).result(10)
            went_away.set()

    training = asyncio.ensure_future(asyncio.to_thread(train, agent, on_step))
    await wait_for(went_away.is_set, what="service stopped")
    await wait_for(lambda: agent.fetch_errors >= 3, timeout=20, what="failed fetches")
    assert not training.done()  # still alive, waiting for data
    to_stop.append(await start_only(settings, "shards"))  # a new one, on the etcd ledger
    seen = await asyncio.wait_for(training, 30)
    await asyncio.to_thread(agent.close)
    assert_exactly_once(read_sample_log(prefix, 1), 60, epochs=1)
    assert len(seen) == 30
    ledger = await shard_status(bus, unique)
    assert (ledger.done, ledger.todo, ledger.in_flight) == (15, 0, ())


async def test_waits_for_a_service_that_starts_late_and_publishes_step_events(
    settings: ServiceSettings,
    unique: str,
    bus: Bus,
    to_stop: list[RunningServices],
    agents_to_close: list[Agent],
) -> None:
    to_stop.append(await start_only(settings, "monitor", "controller"))
    events: list[StepEvent] = []

    async def on_step(event: StepEvent, _: Delivery) -> None:
        events.append(event)

    subject = Subjects(settings.nats.subject_prefix).step(unique, "*")
    await bus.subscribe(subject, StepEvent, on_step)
    await bus.flush()
    cfg = agent_settings(settings.nats, unique, 0, 1, dataset_size=12, global_batch=5)
    agent = await asyncio.to_thread(start_one, cfg, agents_to_close)
    training = asyncio.ensure_future(asyncio.to_thread(train, agent))
    await wait_for(lambda: agent.fetch_errors >= 2, what="fetches without a shards service")
    assert not training.done()  # epochs() waits for the service (first epoch unconfirmed)
    to_stop.append(await start_only(settings, "shards"))
    seen = await asyncio.wait_for(training, 30)
    await asyncio.to_thread(agent.close)
    assert [s for _, s in seen] == [0, 1, 2]
    await wait_for(lambda: len(events) == 3, what="3 step events")
    assert [(e.step, e.samples, e.local_batch) for e in events] == [(0, 5, 5), (1, 5, 5), (2, 2, 5)]
    for e in events:
        assert e.host == "h0" and e.plan_version == 0 and e.epoch == 0
        assert e.compute_s + e.data_wait_s + e.comm_s == pytest.approx(e.step_s)
        assert e.ended_at == pytest.approx(e.started_at + e.step_s)


async def test_survives_a_nats_server_restart(
    settings: ServiceSettings,
    tmp_path: Path,
    unique: str,
    to_stop: list[RunningServices],
    agents_to_close: list[Agent],
) -> None:
    """nats-server killed (-9) mid-epoch and started again: the agent and the services
    reconnect and the epoch completes with every sample once. (A reply lost in flight is
    covered by the test below.)"""
    server = EmbeddedNats(tmp_path / "nats")
    await asyncio.to_thread(spawn, server)
    nats = NatsSettings(
        url=server.url,
        subject_prefix=f"antdt.{unique}",
        reconnect_wait_s=0.05,
        request_timeout_s=0.5,
    )
    bus = await Bus(nats, name="test-restart").connect()
    go_on = threading.Event()
    try:
        to_stop.append(await start_services(settings.model_copy(update={"nats": nats})))
        tap = await ShardsTap(bus, unique).attach()
        prefix = tmp_path / "restart"
        cfg = agent_settings(
            nats, unique, 0, 1, dataset_size=60, global_batch=2, sample_log=str(prefix)
        )
        agent = await asyncio.to_thread(start_one, cfg, agents_to_close)
        at_step_3 = threading.Event()

        def on_step(step: Any) -> None:
            if step.index == 3:
                at_step_3.set()
                go_on.wait(30)

        training = asyncio.ensure_future(asyncio.to_thread(train, agent, on_step))
        await wait_for(at_step_3.is_set, what="step 3")

        async def quiet() -> bool:
            # Prefetch topped up (the shard step 3 used up + 2 ahead) and every request
            # answered: the fetcher has nothing to send until the step syncs.
            answered = all(x.reply is not None for x in tap.exchanges)
            return answered and len(await in_flight(bus, unique)) >= 3  # + reserved

        await wait_for(quiet, what="no request in flight")
        await asyncio.to_thread(server.kill)
        await wait_for(lambda: not bus.connected, what="clients see nats gone")
        go_on.set()
        await wait_for(lambda: agent.fetch_errors >= 2, timeout=20, what="failed fetches")
        assert not training.done()
        await asyncio.to_thread(spawn, server)
        seen = await asyncio.wait_for(training, 60)
        await asyncio.to_thread(agent.close)
        ledger = await shard_status(bus, unique)
        for running in to_stop:  # while their nats-server still runs
            await running.runtime.shutdown()
    finally:
        go_on.set()
        await bus.close()
        await asyncio.to_thread(server.stop)
    assert_exactly_once(read_sample_log(prefix, 1), 60, epochs=1)
    assert len(seen) == 30
    assert (ledger.done, ledger.todo, ledger.in_flight) == (15, 0, ())


def spawn(server: EmbeddedNats) -> None:
    """Start (again) on the same port, retrying a start that died before exec: grpcio >=
    1.81 may crash a child forked from a process using gRPC (here, the services' etcd
    clients) with epoll EBADF before it execs (grpc/grpc#43055)."""
    for attempt in range(3):
        try:
            server.start()
            return
        except ServerError as exc:
            if attempt == 2 or "epoll" not in str(exc):
                raise


async def test_grants_of_a_reply_that_never_arrived_are_not_lost(
    services: RunningServices,
    cluster: EmbeddedCluster,
    settings: ServiceSettings,
    unique: str,
    bus: Bus,
    tmp_path: Path,
    agents_to_close: list[Agent],
) -> None:
    """etcd stalls for longer than the agent's request timeout while the shards service
    commits a grant: the agent gives up on that request and asks again; the service then
    commits the first grant (its reply goes nowhere) and answers the retry with another."""
    tap = await ShardsTap(bus, unique).attach()
    nats = settings.nats.model_copy(update={"request_timeout_s": 0.5})
    prefix = tmp_path / "lost"
    cfg = agent_settings(
        nats, unique, 0, 1, dataset_size=16, global_batch=4, prefetch=1, sample_log=str(prefix)
    )
    agent = await asyncio.to_thread(start_one, cfg, agents_to_close)
    epochs = agent.epochs()
    assert await asyncio.to_thread(next, epochs) == 0
    steps = agent.steps()
    etcd = cluster.etcd.pid
    assert etcd is not None
    os.kill(etcd, signal.SIGSTOP)
    try:
        # Uses up the one shard held: the refill's ledger write now waits on etcd.
        first = await asyncio.to_thread(next, steps)
        await wait_for(lambda: agent.fetch_errors >= 1, what="the refill timed out")
    finally:
        os.kill(etcd, signal.SIGCONT)

    def the_rest() -> None:
        first.sync(object())
        for step in steps:
            step.sync(object())
        for _ in epochs:
            pass

    training = asyncio.ensure_future(asyncio.to_thread(the_rest))
    try:
        pending = lambda: tap.statuses()[FetchStatus.PENDING] > 0  # noqa: E731
        await wait_for(lambda: training.done() or pending(), what="the end of the epoch")
        ledger = await shard_status(bus, unique)
        assert not ledger.in_flight, f"granted, never received by the agent: {ledger.in_flight}"
        await asyncio.wait_for(training, 10)
    finally:
        await asyncio.to_thread(agent.close)
        await asyncio.gather(training, return_exceptions=True)
    assert_exactly_once(read_sample_log(prefix, 1), 16, epochs=1)


async def test_close_unblocks_a_training_thread_waiting_for_data(
    settings: ServiceSettings,
    unique: str,
    to_stop: list[RunningServices],
    agents_to_close: list[Agent],
) -> None:
    to_stop.append(await start_only(settings, "controller"))  # registers; no shards service
    cfg = agent_settings(settings.nats, unique, 0, 1, dataset_size=12, close_timeout_s=0.5)
    agent = await asyncio.to_thread(start_one, cfg, agents_to_close)
    epochs = agent.epochs()  # blocks in next(): the first epoch is never confirmed
    training = asyncio.ensure_future(asyncio.to_thread(next, epochs))
    await wait_for(lambda: agent.fetch_errors >= 1, what="waiting for the service")
    await asyncio.to_thread(agent.close)
    with pytest.raises(AgentClosed):
        await asyncio.wait_for(training, 10)


async def two_ranks_of_a_thousand(
    settings: ServiceSettings,
    bus: Bus,
    job: str,
    prefix: Path,
    to_stop: list[RunningServices],
    agents_to_close: list[Agent],
    *,
    epochs: int,
    heard: tuple[str, type[BaseModel]],
) -> tuple[ShardsTap, list[tuple[float, Any]], list[Agent]]:
    """The controller and shards services, a tap on the job's fetches, what is published
    on `heard`'s subject (when, and the event), and two started agents of a job of a
    thousand ranks (40 samples, `epochs`, sample logs at `prefix`): the service paces
    the waiting ranks' polls for a thousand (5 s apart)."""
    to_stop.append(await start_services(settings, ("controller", "shards")))
    tap = await ShardsTap(bus, job).attach()
    events: list[tuple[float, Any]] = []

    async def on_event(event: BaseModel, _: Delivery) -> None:
        events.append((time.monotonic(), event))

    subject, event_type = heard
    await bus.subscribe(subject, event_type, on_event)
    world = 1000
    shape = {
        "dataset_size": 40,
        "global_batch": 2 * world,
        "epochs": epochs,
        "sample_log": str(prefix),
    }
    agents = [
        Agent(agent_settings(settings.nats, job, r, world, **shape), collectives=NullCollectives())
        for r in range(2)
    ]
    agents_to_close.extend(agents)
    await asyncio.to_thread(start_all, agents)
    return tap, events, agents


def told_to_wait(tap: ShardsTap, epoch: int) -> list[int]:
    """Where, in rank 0's answered requests (`tap.timed(0)`), its settles of `epoch` were
    told that shards of it are still held."""
    return [
        i
        for i, (_, _, fetch, reply) in enumerate(tap.timed(0))
        if fetch.settle and fetch.epoch == epoch and reply.outstanding
    ]


@pytest.mark.parametrize("held_in", [0, 1], ids=["next_epoch", "job_end"])
async def test_ranks_waiting_for_the_next_epoch_are_told_at_once_and_poll_seldom(
    settings: ServiceSettings,
    unique: str,
    bus: Bus,
    tmp_path: Path,
    agents_to_close: list[Agent],
    to_stop: list[RunningServices],
    held_in: int,
) -> None:
    """A job of a thousand ranks (two run here): rank 0, out of epoch `held_in`, waits
    to leave it while rank 1 holds its last shards. Its polls are 5 s apart (a
    thousand ranks polling every 0.05 s would ask 20,000 times a second), yet it asks
    again as soon as rank 1's done refs finish the epoch: the service announces it
    (EpochFinished). So for the last epoch too: it learns at once that the job is done
    (before, only the ends of the epochs before the last were announced)."""
    subject = Subjects(settings.nats.subject_prefix).epoch_finished(unique)
    prefix = tmp_path / "told"
    tap, announced, agents = await two_ranks_of_a_thousand(
        settings,
        bus,
        unique,
        prefix,
        to_stop,
        agents_to_close,
        epochs=2,
        heard=(subject, EpochFinished),
    )
    paused, resume = threading.Event(), threading.Event()

    def hold(step: Any) -> None:
        if step.epoch == held_in and not paused.is_set():  # rank 1 stops, holding shards
            paused.set()
            resume.wait(30)

    def waits() -> list[int]:  # rank 0, out of the held epoch, told its shards are held
        return told_to_wait(tap, held_in)

    training = asyncio.ensure_future(asyncio.to_thread(run_ranks, agents, [None, hold]))
    try:
        await wait_for(paused.is_set, what="rank 1 paused")
        await wait_for(lambda: len(waits()) >= 1, what="rank 0 waits")
        await asyncio.sleep(1.5)  # 30 polls at 0.05 s each
        assert len(waits()) <= 2 and len(announced) == held_in
    finally:
        resume.set()
    await asyncio.wait_for(training, 30)
    await asyncio.to_thread(close_all, agents)
    assert [(e.epoch, e.incarnation) for _, e in announced] == [(0, 0), (1, 0)]
    timed, waited = tap.timed(0), waits()
    _, last_pending_at, _, last_pending = timed[waited[-1]]
    assert last_pending.retry_after_s == 5.0
    asked_at, _, fetch, reply = timed[waited[-1] + 1]
    assert fetch.settle and reply.outstanding in (0, None)
    if held_in == 0:
        assert reply.status is FetchStatus.EPOCH_DONE
        _, _, fetch, reply = timed[waited[-1] + 2]
        assert (fetch.epoch, reply.epoch, reply.status) == (1, 1, FetchStatus.OK) and reply.grants
    else:
        assert reply.status is FetchStatus.JOB_DONE
    # Asked once told, not at its next poll: 5 s after the last PENDING.
    told_at = announced[held_in][0]
    assert asked_at - last_pending_at < 4.0 and asked_at - told_at < 1.0
    assert_exactly_once(read_sample_log(prefix, 2), 40, epochs=2)


async def test_ranks_waiting_to_leave_an_epoch_ask_again_once_shards_come_back(
    settings: ServiceSettings,
    unique: str,
    bus: Bus,
    tmp_path: Path,
    agents_to_close: list[Agent],
    to_stop: list[RunningServices],
) -> None:
    """A job of a thousand ranks (two run here): rank 1 stops after a step, holding
    shards, while rank 0 runs out of epoch 0 and waits to leave it, polling 5 s apart.
    Then rank 1 leaves (agent.leave): the service announces the hand-back
    (ShardsReturned) and rank 0 asks again at once, not at its next poll; the epoch is
    open again for it (settle answered OK) and it trains what came back."""
    subject = Subjects(settings.nats.subject_prefix).shards_returned(unique)
    prefix = tmp_path / "returned"
    tap, returned, agents = await two_ranks_of_a_thousand(
        settings,
        bus,
        unique,
        prefix,
        to_stop,
        agents_to_close,
        epochs=1,
        heard=(subject, ShardsReturned),
    )
    paused, resume = threading.Event(), threading.Event()

    def train_then_leave(agent: Agent) -> None:  # rank 1: one step, then leaves when told
        for _ in agent.epochs():
            for step in agent.steps():
                step.sync(object())
                paused.set()
                resume.wait(30)
                agent.leave("test")
                return

    def waits() -> list[int]:  # rank 0, out of epoch 0, told that shards are held
        return told_to_wait(tap, 0)

    leaving = asyncio.ensure_future(asyncio.to_thread(train_then_leave, agents[1]))
    await wait_for(paused.is_set, what="rank 1 paused")
    training = asyncio.ensure_future(asyncio.to_thread(train, agents[0]))
    try:
        await wait_for(lambda: len(waits()) >= 1, what="rank 0 waits")
        await asyncio.sleep(0.5)
        assert len(waits()) == 1 and not returned  # polls seldom; nothing came back yet
    finally:
        resume.set()
    await asyncio.wait_for(leaving, 30)
    await asyncio.wait_for(training, 30)
    await asyncio.to_thread(agents[0].close)
    [(told_at, event)] = returned
    assert (event.ranks, event.returned > 0) == ((1,), True)
    timed, waited = tap.timed(0), waits()
    last = waited[-1]  # the last wait (a slow machine may have polled more than once)
    _, last_wait_at, _, last_wait = timed[last]
    assert last_wait.retry_after_s == 5.0
    asked_at, _, fetch, reply = timed[last + 1]
    assert fetch.settle and reply.status is FetchStatus.OK and not reply.outstanding
    # Asked once told, not at its next poll, due 5 s after the last wait: told well before
    # that (as here but on a stalled machine), the ask comes well before it too.
    assert asked_at - told_at < 1.0
    if told_at - last_wait_at < 3.5:
        assert asked_at - last_wait_at < 4.5
    assert_exactly_once(read_sample_log(prefix, 2), 40, epochs=1)


async def test_shards_a_rank_never_heard_of_come_to_it_when_its_group_settles(
    settings: ServiceSettings,
    unique: str,
    bus: Bus,
    tmp_path: Path,
    agents_to_close: list[Agent],
    to_stop: list[RunningServices],
) -> None:
    """Rank 1 took shards and went away; rank 0 trains the rest and waits to leave epoch
    0. Rank 1 is released (its shards handed back), and a fetch of rank 0's own, which a
    stalled replica held, is applied right after: it takes every shard that came back,
    and its reply goes nowhere. Rank 0's next settle hands them to it, it trains them,
    and the job ends: every sample exactly once. Before, rank 0 waited for them for good
    (the settle answered them as outstanding, and nothing was left to grant)."""
    subject = Subjects(settings.nats.subject_prefix).shards_returned(unique)
    prefix = tmp_path / "strays"
    tap, _, agents = await two_ranks_of_a_thousand(
        settings,
        bus,
        unique,
        prefix,
        to_stop,
        agents_to_close,
        epochs=1,
        heard=(subject, ShardsReturned),
    )

    def take_then_go(agent: Agent) -> None:  # rank 1 holds shards, trains none of them
        for _ in agent.epochs():
            for _ in agent.steps():
                break  # the step never syncs: nothing of it reaches the model
            break
        agent.close()

    await asyncio.to_thread(take_then_go, agents[1])

    training = asyncio.ensure_future(asyncio.to_thread(train, agents[0]))
    await wait_for(lambda: len(told_to_wait(tap, 0)) >= 1, what="rank 0 waits")
    subjects = Subjects(settings.nats.subject_prefix)
    release = ShardRelease(job=unique, rank=1, reason="lease expired")
    late = ShardFetch(job=unique, rank=0, epoch=0, want=8, held=())
    # Rank 0's loop stalls meanwhile, so that the hand-back's announcement (which makes
    # it ask at once) reaches it only after the late fetch took what came back.
    stalled, resume = threading.Event(), threading.Event()
    session = agents[0]._session
    assert session is not None
    session.thread.call_soon(lambda: (stalled.set(), resume.wait(30)))
    await wait_for(stalled.is_set, what="rank 0's loop stalled")
    try:
        released = await bus.request(subjects.shards(unique, "release"), release, ReleaseReply)
        stray = await bus.request(subjects.shards(unique, "fetch"), late, ShardReply)
    finally:
        resume.set()
    assert released.returned > 0 and len(stray.grants) == released.returned
    await asyncio.wait_for(training, 30)
    await asyncio.to_thread(agents[0].close)
    handed = [reply for _, _, fetch, reply in tap.timed(0) if fetch.settle and reply.grants]
    assert [g.ref() for g in handed[0].grants] == [g.ref() for g in stray.grants]
    assert_exactly_once(read_sample_log(prefix, 1), 40, epochs=1)  # rank 1 trained none
