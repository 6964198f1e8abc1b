"""Two shards replicas on one job, real nats-server and etcd: many ranks doing done+fetch
at once never see a shard granted to two ranks, never lose one, and finish the job.

The first test runs both replicas in the service's queue group, as deployed. The second
gives each replica its own subject prefix (same etcd keys), so hypothesis can choose which
replica each request reaches: their cached ledgers go stale in every order it can find,
and only etcd's compare-and-swap keeps the grants apart."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from antdt.runtime.bus import Bus, BusError, RequestRefused
from antdt.runtime.config import ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.store import Store
from antdt.schemas import FetchStatus, JobSpec, Keys, ShardFetch, ShardReply, Subjects
from antdt.services.runner import start_service
from antdt.services.shards.ledger import LedgerState
from antdt.services.shards.service import ShardsService, ShardsSettings

pytestmark = pytest.mark.integration


async def start_replica(
    base: ServiceSettings, name: str, runtime: ServiceRuntime, prefix: str | None = None
) -> ShardsService:
    nats = base.nats.model_copy(update={"subject_prefix": prefix or base.nats.subject_prefix})
    settings = ShardsSettings(**{**base.model_dump(), "nats": nats, "replica_id": name})
    service: ShardsService = await start_service("shards", settings, runtime)
    return service


async def register(
    store: Store, base: ServiceSettings, job: str, *, world: int, shards: int, epochs: int
) -> None:
    """A job of `shards` 3-sample shards, its spec written where the replicas read it."""
    spec = JobSpec(
        job=job,
        world_size=world,
        dataset_size=shards * 3,
        shard_size=3,
        global_batch=world,
        epochs=epochs,
    )
    await store.put(Keys(base.etcd.key_prefix).spec(job), spec.model_dump_json().encode())


#: Requests a test's ranks may see go unanswered before it fails: a replica dropping
#: requests under a flood (counted, the rank asks again) loses a few, a stuck one all.
MAX_LOST = 5


@dataclass
class Fleet:
    """The ranks of one job as seen by the test: what each holds, and every grant and
    completion so far, checked on every reply."""

    job: str
    world: int
    owner: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    completed: Counter[tuple[int, int]] = field(default_factory=Counter)
    held: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    epoch: dict[int, int] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    busy: int = 0
    lost: int = 0  # requests that got no reply in time (an overloaded replica drops some)

    def request(self, rank: int, want: int, report: int | None = None) -> ShardFetch:
        held = self.held.get(rank, ())
        done = held if report is None else held[:report]
        return ShardFetch(
            job=self.job, rank=rank, epoch=self.epoch.get(rank, 0), done=done, want=want
        )

    def on_reply(self, rank: int, sent: ShardFetch, reply: ShardReply) -> float:
        """Check and account one reply; returns how long the rank should wait."""
        for grant in reply.grants:
            taken = self.owner.setdefault((grant.epoch, grant.shard), (rank, grant.attempt))
            assert taken == (rank, grant.attempt), f"{grant} granted to {rank}, held by {taken}"
        for ref in sent.done:  # confirmed once durable: each rank reports each grant once
            self.completed[(ref.epoch, ref.shard)] += 1
        reported = {(ref.epoch, ref.shard) for ref in sent.done}
        self.held[rank] = tuple(g.ref() for g in reply.grants if (g.epoch, g.shard) not in reported)
        if reply.status == FetchStatus.JOB_DONE:
            self.finished.add(rank)
        elif reply.status == FetchStatus.EPOCH_DONE and not self.held[rank]:
            self.epoch[rank] = sent.epoch + 1  # ask for the next epoch
        return reply.retry_after_s if reply.status == FetchStatus.PENDING else 0.0

    async def send(self, bus: Bus, subject: str, rank: int, sent: ShardFetch) -> float:
        try:
            reply = await bus.request(subject, sent, ShardReply, timeout=10)
        except RequestRefused as refused:
            assert refused.reply.code == "busy", refused.reply  # contention: retry as is
            self.busy += 1
            return 0.0
        except BusError:  # no reply in time: asked again, with what it holds, as agents do
            self.lost += 1
            assert self.lost <= MAX_LOST, "replies lost again and again"
            return 0.0
        return self.on_reply(rank, sent, reply)

    def check_complete(self, num_shards: int, epochs: int) -> None:
        every = {(e, s): 1 for e in range(epochs) for s in range(num_shards)}
        assert dict(self.completed) == every, "a shard was lost or completed twice"
        assert set(self.owner) == set(every)
        assert self.finished == set(range(self.world))


async def ledger_in_etcd(store: Store, base: ServiceSettings, job: str) -> LedgerState:
    stored = await store.get_model(Keys(base.etcd.key_prefix).ledger(job), LedgerState)
    assert stored is not None
    return stored[0]


async def test_many_ranks_against_two_replicas_in_the_queue_group(
    settings: ServiceSettings, store: Store
) -> None:
    world, shards, epochs = 16, 40, 3
    job = "qgroup"
    await register(store, settings, job, world=world, shards=shards, epochs=epochs)
    runtime = ServiceRuntime("replicas")
    replicas = [await start_replica(settings, f"r{i}", runtime) for i in range(2)]
    buses = [await Bus(settings.nats, name=f"rank-{r}").connect() for r in range(world)]
    subject = Subjects(settings.nats.subject_prefix).shards(job, "fetch")
    fleet = Fleet(job, world)

    async def rank_loop(rank: int) -> None:
        rng = random.Random(rank)  # reports a few held shards, asks for a few more
        while rank not in fleet.finished:
            held = len(fleet.held.get(rank, ()))
            sent = fleet.request(rank, rng.randint(1, 3), rng.randint(min(held, 1), held))
            if wait := await fleet.send(buses[rank], subject, rank, sent):
                await asyncio.sleep(wait)  # PENDING: the protocol's own retry delay

    try:
        await asyncio.wait_for(asyncio.gather(*(rank_loop(r) for r in range(world))), 60)
    finally:
        for bus in buses:
            await bus.close()
        await runtime.shutdown()
    fleet.check_complete(shards, epochs)
    assert (await ledger_in_etcd(store, settings, job)).complete
    assert all(r.committer.commits > 0 for r in replicas), "both replicas must have served"
    assert sum(r.committer.committed for r in replicas) >= world * epochs


# One step: (replica, rank, want, how many held shards to report, ends a wave of
# requests sent at once).
steps = st.lists(
    st.tuples(
        st.integers(0, 1), st.integers(0, 5), st.integers(0, 3), st.integers(0, 3), st.booleans()
    ),
    min_size=1,
    max_size=30,
)


@dataclass
class Directed:
    buses: list[Bus]
    prefixes: list[str]


@pytest.fixture
async def directed(settings: ServiceSettings) -> Any:
    """Two replicas, each on its own subject prefix, sharing the etcd keys."""
    runtime = ServiceRuntime("directed")
    prefixes = [f"{settings.nats.subject_prefix}.r{i}" for i in range(2)]
    replicas = [await start_replica(settings, f"d{i}", runtime, p) for i, p in enumerate(prefixes)]
    buses = [await Bus(settings.nats, name=f"client-{i}").connect() for i in range(2)]
    yield Directed(buses, prefixes)
    for bus in buses:
        await bus.close()
    await runtime.shutdown()
    assert sum(r.committer.cas_conflicts for r in replicas) > 0, "no interleaving conflicted"


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schedule=steps)
async def test_any_interleaving_of_two_replicas_grants_each_shard_once(
    directed: Directed, settings: ServiceSettings, store: Store, schedule: list[Any]
) -> None:
    world, shards, epochs = 6, 10, 2
    job = "j" + uuid.uuid4().hex[:8]
    await register(store, settings, job, world=world, shards=shards, epochs=epochs)
    fleet = Fleet(job, world)

    async def send(replica: int, rank: int, sent: ShardFetch) -> float:
        subject = Subjects(directed.prefixes[replica]).shards(job, "fetch")
        return await fleet.send(directed.buses[replica], subject, rank, sent)

    wave: list[tuple[int, int, ShardFetch]] = []
    for replica, rank, want, report, ends in schedule:
        if all(rank != r for _, r, _ in wave):  # a rank has one request in flight
            wave.append((replica, rank, fleet.request(rank, want, report)))
        if ends or len(wave) == world:
            await asyncio.gather(*(send(*step) for step in wave))
            wave = []
    await asyncio.gather(*(send(*step) for step in wave))
    for round_ in range(200):  # then all finish, every round through the other replica
        if len(fleet.finished) == world:
            break
        ranks = [r for r in range(world) if r not in fleet.finished]
        waits = await asyncio.gather(*(send(round_ % 2, r, fleet.request(r, 3)) for r in ranks))
        if any(waits):
            await asyncio.sleep(max(waits))  # PENDING: the protocol's own retry delay
    fleet.check_complete(shards, epochs)
    assert (await ledger_in_etcd(store, settings, job)).complete
