"""The agent's shard stream against a small in-test shards/register responder over the
real nats-server: spanning batches, done-after-sync, epochs, PENDING/EPOCH_DONE/JOB_DONE,
outages of the responder, and exact-once sample accounting over several ranks.

The responder is deliberately simple (an in-memory ledger): it speaks the agent's
protocol with real messages so the agent can be tested before the real services exist."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from antdt.agent import Agent, AgentClosed, AgentSettings
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import NatsSettings, ServiceSettings
from antdt.runtime.servers import EmbeddedNats
from antdt.schemas import (
    FetchStatus,
    JobSpec,
    Plan,
    RegisterReply,
    ShardFetch,
    ShardGrant,
    ShardRef,
    ShardReply,
    StepEvent,
    Subjects,
)
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


@dataclass
class FakeServices:
    """In-memory ledger answering `shards.fetch`, plus the controller's `register`."""

    job: str
    dataset_size: int
    shard_size: int
    epochs: int = 1
    pending_first: int = 0  # PENDING answers before each new epoch opens
    epoch: int = 0
    job_done: bool = False
    fetches: list[ShardFetch] = field(default_factory=list)
    replies: list[ShardReply] = field(default_factory=list)
    done_refs: list[ShardRef] = field(default_factory=list)
    registered: list[JobSpec] = field(default_factory=list)
    bus: Bus | None = None

    def __post_init__(self) -> None:
        self.num_shards = math.ceil(self.dataset_size / self.shard_size)
        self._open_epoch()
        self.pending_left = 0

    def _open_epoch(self) -> None:
        self.todo: deque[int] = deque(range(self.num_shards))
        self.doing: dict[int, int] = {}  # shard -> rank
        self.done: set[int] = set()

    # -- the ledger ------------------------------------------------------------------

    def fetch(self, req: ShardFetch) -> ShardReply:
        self.fetches.append(req)
        for ref in req.done:
            self._finish(ref)
        reply = self._answer(req)
        self.replies.append(reply)
        return reply

    def _finish(self, ref: ShardRef) -> None:
        if ref.epoch != self.epoch or ref.shard not in self.doing:
            return  # a repeated done is a no-op
        del self.doing[ref.shard]
        self.done.add(ref.shard)
        self.done_refs.append(ref)
        if len(self.done) == self.num_shards:
            self.epoch += 1
            self.job_done = self.epoch >= self.epochs
            self.pending_left = self.pending_first
            self._open_epoch()

    def _reply(self, status: FetchStatus, grants: tuple[ShardGrant, ...] = ()) -> ShardReply:
        retry = 0.02 if status is FetchStatus.PENDING else 0.0
        return ShardReply(job=self.job, epoch=self.epoch, status=status, grants=grants,
                          retry_after_s=retry)  # fmt: skip

    def _answer(self, req: ShardFetch) -> ShardReply:
        if self.job_done:
            return self._reply(FetchStatus.JOB_DONE)
        if req.epoch > self.epoch:
            return self._reply(FetchStatus.PENDING)
        if self.pending_left > 0:  # pretend other ranks still hold the previous epoch
            self.pending_left -= 1
            return self._reply(FetchStatus.PENDING).model_copy(update={"epoch": self.epoch - 1})
        # Like a robust service, re-send what this rank holds with every answer: a reply
        # lost on the way (NATS restarting) would otherwise strand its grants. The agent
        # ignores grants it has seen, so the replay is harmless.
        grants = [self._grant(shard) for shard, rank in self.doing.items() if rank == req.rank]
        new = 0
        while new < req.want and self.todo:
            shard = self.todo.popleft()
            self.doing[shard] = req.rank
            grants.append(self._grant(shard))
            new += 1
        if not new and req.want > 0 and not self.todo:
            return self._reply(FetchStatus.EPOCH_DONE, tuple(grants))
        return self._reply(FetchStatus.OK, tuple(grants))

    def _grant(self, shard: int) -> ShardGrant:
        start = shard * self.shard_size
        end = min(start + self.shard_size, self.dataset_size)
        return ShardGrant(epoch=self.epoch, shard=shard, attempt=0, start=start, end=end)

    def register(self, spec: JobSpec) -> RegisterReply:
        created = not self.registered
        self.registered.append(spec)
        stored = self.registered[0]
        plan = Plan(job=self.job, version=0, local_batch=stored.equal_shares(), effective_step=0,
                    created_at=time.time())  # fmt: skip
        return RegisterReply(spec=stored, plan=plan, created=created)

    # -- serving -------------------------------------------------------------------

    async def serve(self, nats: NatsSettings, *, shards: bool = True) -> FakeServices:
        subjects = Subjects(nats.subject_prefix)
        self.bus = bus = await Bus(nats, name="fake-services").connect()

        async def on_fetch(req: ShardFetch, _: Delivery) -> ShardReply:
            return self.fetch(req)

        async def on_register(spec: JobSpec, _: Delivery) -> RegisterReply:
            return self.register(spec)

        await bus.subscribe(subjects.register(self.job), JobSpec, on_register)
        if shards:
            await bus.subscribe(subjects.shards(self.job, "fetch"), ShardFetch, on_fetch)
        await bus.flush()
        return self

    async def stop(self) -> None:
        if self.bus is not None:
            await self.bus.close()
            self.bus = None


class ThreadCollectives:
    """Ranks as threads of this process: SUMs through a barrier instead of gloo."""

    def __init__(self, world: int) -> None:
        self._values = [0] * world
        self._barrier = threading.Barrier(world, timeout=30)
        self.calls = Counter[str]()

    def rank(self, rank: int) -> Any:
        outer = self

        class _Rank:
            def count(self, local_samples: int) -> int:
                return outer._sum(rank, local_samples, "count")

            def reduce_gradients(self, model: Any, local_samples: int) -> int:
                return outer._sum(rank, local_samples, "grads")

        return _Rank()

    def _sum(self, rank: int, value: int, what: str) -> int:
        self._values[rank] = value
        self._barrier.wait()
        total = sum(self._values)
        if rank == 0:
            self.calls[what] += 1
        self._barrier.wait()  # nobody overwrites a value before everyone has read the sum
        return total


def agent_settings(nats: NatsSettings, job: str, rank: int, world: int, **kw: Any) -> AgentSettings:
    values: dict[str, Any] = {
        "dataset_size": 50, "shard_size": 4, "global_batch": 3 * world, "epochs": 1,
        "register_timeout_s": 15.0, "host": f"h{rank}", "inject": "",
    }  # fmt: skip
    values.update(kw)
    return AgentSettings(nats=nats, job=job, rank=rank, world_size=world, **values)


def train(agent: Agent, on_step: Callable[[Any], None] | None = None) -> list[tuple[int, int]]:
    """The documented training loop without a model; returns (epoch, step) pairs."""
    seen = []
    for epoch in agent.epochs():
        for step in agent.steps():
            if on_step is not None:
                on_step(step)
            step.sync(object())
            seen.append((epoch, step.index))
    return seen


def read_sample_log(prefix: Path, world: int) -> dict[int, list[dict[str, Any]]]:
    out = {}
    for rank in range(world):
        path = Path(f"{prefix}.rank{rank}.jsonl")
        out[rank] = [json.loads(line) for line in path.read_text().splitlines()]
    return out


def assert_exactly_once(lines: dict[int, list[dict[str, Any]]], size: int, epochs: int) -> None:
    for epoch in range(epochs):
        counts = Counter(
            i for rank in lines.values() for ln in rank if ln["epoch"] == epoch for i in ln["ids"]
        )
        assert sorted(counts) == list(range(size)), f"epoch {epoch}: missing or extra ids"
        assert max(counts.values()) == 1, f"epoch {epoch}: repeated ids"


def start_all(agents: list[Agent]) -> None:
    for agent in agents:
        agent.start()


def close_all(agents: list[Agent]) -> None:
    for agent in agents:
        agent.close()


def run_ranks(agents: list[Agent], **kw: Any) -> list[list[tuple[int, int]]]:
    results: list[list[tuple[int, int]]] = [[] for _ in agents]
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            results[i] = train(agents[i], **kw)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(agents))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


# -- tests -----------------------------------------------------------------------------


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


async def test_three_ranks_two_epochs_every_sample_once(
    settings: ServiceSettings, unique: str, tmp_path: Path, agents_to_close: list[Agent]
) -> None:
    fake = await FakeServices(unique, dataset_size=50, shard_size=4, epochs=2,
                              pending_first=2).serve(settings.nats)  # fmt: skip
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
    await fake.stop()
    # Same global step sequence on every rank, continuing across epochs.
    assert seen[0] == seen[1] == seen[2]
    assert [s for _, s in seen[0]] == list(range(len(seen[0])))
    assert {e for e, _ in seen[0]} == {0, 1}
    assert_exactly_once(read_sample_log(prefix, world), 50, epochs=2)
    assert fake.job_done and len(fake.done_refs) == 2 * fake.num_shards
    statuses = Counter(r.status for r in fake.replies)
    assert statuses[FetchStatus.PENDING] >= 2  # the next epoch was waited for
    assert statuses[FetchStatus.EPOCH_DONE] >= 1 and statuses[FetchStatus.JOB_DONE] >= 1
    assert all(a.dropped_events == 0 for a in agents)


async def test_batches_span_shards_and_done_waits_for_sync(
    settings: ServiceSettings, unique: str, agents_to_close: list[Agent]
) -> None:
    fake = await FakeServices(unique, dataset_size=20, shard_size=4).serve(settings.nats)
    cfg = agent_settings(settings.nats, unique, 0, 1, dataset_size=20, global_batch=6, prefetch=2)
    agent = await asyncio.to_thread(start_one, cfg, agents_to_close)
    epochs = agent.epochs()
    assert await asyncio.to_thread(next, epochs) == 0
    steps = agent.steps()
    step = await asyncio.to_thread(next, steps)
    # All 4 ids of shard 0 and 2 of shard 1 (in its own order): the batch spans shards.
    ids = step.sample_ids
    assert len(set(ids)) == 6 and set(ids[:4]) == set(range(4)) and set(ids[4:]) < set(range(4, 8))
    # Shard 0 is used up: the agent refills its prefetch before the step syncs, and that
    # request must not report shard 0 yet.
    await wait_for(lambda: len(fake.fetches) >= 2, what="refill fetch")
    assert fake.fetches[1].want == 1
    assert all(not f.done for f in fake.fetches) and 0 in fake.doing
    await asyncio.to_thread(step.sync, object())
    await wait_for(lambda: fake.done_refs, what="done after sync")
    assert [r.shard for r in fake.done_refs] == [0]
    assert 1 in fake.doing  # shard 1 is only half consumed
    rest = await asyncio.to_thread(lambda: [s.sample_ids for s in _sync_all(steps)])
    assert sorted(step.sample_ids + [i for ids in rest for i in ids]) == list(range(20))
    assert [len(ids) for ids in rest] == [6, 6, 2]  # the tail is short
    assert await asyncio.to_thread(lambda: list(epochs)) == []  # JOB_DONE ends epochs()
    await asyncio.to_thread(agent.close)
    await fake.stop()
    assert sorted(r.shard for r in fake.done_refs) == list(range(5))


def _sync_all(steps: Iterator[Any]) -> Iterator[Any]:
    for step in steps:
        step.sync(object())
        yield step


async def test_survives_the_shards_service_disappearing(
    settings: ServiceSettings, unique: str, tmp_path: Path, agents_to_close: list[Agent]
) -> None:
    fake = await FakeServices(unique, dataset_size=60, shard_size=4).serve(settings.nats)
    prefix = tmp_path / "outage"
    cfg = agent_settings(settings.nats, unique, 0, 1, dataset_size=60, global_batch=2,
                         sample_log=str(prefix))  # fmt: skip
    agent = await asyncio.to_thread(start_one, cfg, agents_to_close)
    loop = asyncio.get_running_loop()
    went_away = threading.Event()

    def on_step(step: Any) -> None:
        if step.index == 3:  # take the service away mid-epoch, from the training thread
            asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(10)
            went_away.set()

    training = asyncio.ensure_future(asyncio.to_thread(train, agent, on_step))
    await wait_for(went_away.is_set, what="service stopped")
    await wait_for(lambda: agent.fetch_errors >= 3, timeout=20, what="failed fetches")
    assert not training.done()  # still alive, waiting for data
    await fake.serve(settings.nats)
    seen = await asyncio.wait_for(training, 30)
    await asyncio.to_thread(agent.close)
    await fake.stop()
    assert_exactly_once(read_sample_log(prefix, 1), 60, epochs=1)
    assert len(seen) == 30 and fake.job_done


async def test_waits_for_a_service_that_starts_late_and_publishes_step_events(
    settings: ServiceSettings, unique: str, bus: Bus, agents_to_close: list[Agent]
) -> None:
    fake = await FakeServices(unique, dataset_size=12, shard_size=4).serve(
        settings.nats, shards=False
    )
    events: list[StepEvent] = []

    async def on_step(event: StepEvent, _: Delivery) -> None:
        events.append(event)

    subject = Subjects(settings.nats.subject_prefix).step(unique, "*")
    await bus.subscribe(subject, StepEvent, on_step)
    await bus.flush()
    cfg = agent_settings(settings.nats, unique, 0, 1, dataset_size=12, global_batch=5)
    agent = await asyncio.to_thread(start_one, cfg, agents_to_close)
    training = asyncio.ensure_future(asyncio.to_thread(train, agent))
    await wait_for(lambda: agent.fetch_errors >= 2, what="fetches without a responder")
    assert not training.done()  # epochs() waits for the service (first epoch unconfirmed)
    await fake.stop()
    await fake.serve(settings.nats)
    seen = await asyncio.wait_for(training, 30)
    await asyncio.to_thread(agent.close)
    await fake.stop()
    assert [s for _, s in seen] == [0, 1, 2]
    await wait_for(lambda: len(events) == 3, what="3 step events")
    assert [(e.step, e.samples, e.local_batch) for e in events] == [(0, 5, 5), (1, 5, 5), (2, 2, 5)]
    for e in events:
        assert e.host == "h0" and e.plan_version == 0 and e.epoch == 0
        assert e.compute_s + e.data_wait_s + e.comm_s == pytest.approx(e.step_s)
        assert e.ended_at == pytest.approx(e.started_at + e.step_s)


async def test_survives_a_nats_server_restart(
    tmp_path: Path, unique: str, agents_to_close: list[Agent]
) -> None:
    server = await asyncio.to_thread(EmbeddedNats(tmp_path / "nats").start)
    nats = NatsSettings(url=server.url, subject_prefix=f"antdt.{unique}", reconnect_wait_s=0.05,
                        request_timeout_s=0.5)  # fmt: skip
    fake = await FakeServices(unique, dataset_size=60, shard_size=4).serve(nats)
    prefix = tmp_path / "restart"
    cfg = agent_settings(nats, unique, 0, 1, dataset_size=60, global_batch=2,
                         sample_log=str(prefix))  # fmt: skip
    agent = await asyncio.to_thread(start_one, cfg, agents_to_close)
    killed = threading.Event()

    def on_step(step: Any) -> None:
        if step.index == 3:
            server.kill()
            killed.set()

    try:
        training = asyncio.ensure_future(asyncio.to_thread(train, agent, on_step))
        await wait_for(killed.is_set, what="nats killed")
        await wait_for(lambda: agent.fetch_errors >= 2, timeout=20, what="failed fetches")
        assert not training.done()
        await asyncio.to_thread(server.start)
        seen = await asyncio.wait_for(training, 60)
        await asyncio.to_thread(agent.close)
        await fake.stop()
    finally:
        await asyncio.to_thread(server.stop)
    assert_exactly_once(read_sample_log(prefix, 1), 60, epochs=1)
    assert len(seen) == 30 and fake.job_done


async def test_close_unblocks_a_training_thread_waiting_for_data(
    settings: ServiceSettings, unique: str, agents_to_close: list[Agent]
) -> None:
    fake = await FakeServices(unique, dataset_size=12, shard_size=4).serve(
        settings.nats, shards=False
    )
    cfg = agent_settings(settings.nats, unique, 0, 1, dataset_size=12, close_timeout_s=0.5)
    agent = await asyncio.to_thread(start_one, cfg, agents_to_close)
    epochs = agent.epochs()  # blocks in next(): the first epoch is never confirmed
    training = asyncio.ensure_future(asyncio.to_thread(next, epochs))
    await wait_for(lambda: agent.fetch_errors >= 1, what="waiting for the service")
    await asyncio.to_thread(agent.close)
    with pytest.raises(AgentClosed):
        await asyncio.wait_for(training, 10)
    await fake.stop()
