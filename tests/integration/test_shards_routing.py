"""Job affinity between two shards replicas (routing.py), real nats-server and etcd:
ranks that follow the route in each reply end up at one replica, so the two stop
contending for the job's ledger; when that replica goes, the ranks fall back to the
queue group, the other replica claims the job, and no shard is granted twice or lost."""

from __future__ import annotations

import asyncio
import time

import pytest

from antdt.agent.ledger import LedgerClient
from antdt.agent.route import ShardRoute
from antdt.agent.shards import ShardStream
from antdt.agent.stream_state import StreamState
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.store import Store
from antdt.schemas import (
    CommitReply,
    EpochFinished,
    Keys,
    ShardCommit,
    ShardReply,
    Subjects,
    route_token,
)
from antdt.services.runner import start_service
from antdt.services.shards.service import ShardsService, ShardsSettings
from tests.helpers import wait_for
from tests.integration.test_shards_concurrency import Fleet, ledger_in_etcd, register, start_replica

pytestmark = pytest.mark.integration


class Ranks:
    """`world` ranks of one job, each following its replies' route as the agent does."""

    def __init__(self, settings: ServiceSettings, job: str, world: int) -> None:
        self.settings, self.job, self.world = settings, job, world
        self.fleet = Fleet(job, world)
        subjects = Subjects(settings.nats.subject_prefix)
        self.routes = [ShardRoute(subjects, job, cooldown_s=30) for _ in range(world)]
        self.buses: list[Bus] = []
        self.failures = 0
        self.seen: set[str] = set()  # every route a reply named

    async def connect(self) -> Ranks:
        self.buses = [
            await Bus(self.settings.nats, name=f"rank-{r}").connect() for r in range(self.world)
        ]
        return self

    async def step(self, rank: int) -> None:
        """One done-and-fetch; a failed request falls back to the queue group."""
        route, fleet = self.routes[rank], self.fleet
        held = len(fleet.held.get(rank, ()))
        sent = fleet.request(rank, want=1, report=min(held, 1))
        try:
            reply = await self.buses[rank].request(route.subject, sent, ShardReply, timeout=5)
        except Exception:
            self.failures += 1
            route.on_failure(time.monotonic())
            await asyncio.sleep(0.02)
            return
        route.on_reply(reply.route, time.monotonic())
        self.seen.add(reply.route)
        if wait := fleet.on_reply(rank, sent, reply):
            await asyncio.sleep(wait)

    async def run(self, steps: int) -> None:
        async def one(rank: int) -> None:
            for _ in range(steps):
                if rank not in self.fleet.finished:
                    await self.step(rank)

        await asyncio.gather(*(one(r) for r in range(self.world)))

    async def converge(self) -> str:
        """Run a round of steps at a time until every rank has a route (a replica's claim
        is through, which takes an etcd write: rounds back to back could take the job's
        last shards first); they all name one replica: its token."""

        async def routed() -> bool:
            await self.run(steps=1)
            return all(r.route for r in self.routes)

        await wait_for(routed, what="a route for every rank")
        routes = {r.route for r in self.routes}
        assert len(routes) == 1 and "" not in routes
        return routes.pop()

    async def close(self) -> None:
        for bus in self.buses:
            await bus.close()


async def two_replicas(
    settings: ServiceSettings, host: str
) -> tuple[list[ServiceRuntime], list[ShardsService], list[str]]:
    """Two replicas (ids host0, host1), each in its own runtime so that one can go, and
    their route tokens."""
    runtimes = [ServiceRuntime(f"replica-{i}") for i in range(2)]
    replicas = [await start_replica(settings, f"{host}{i}", runtimes[i]) for i in range(2)]
    return runtimes, replicas, [route_token(f"{host}{i}") for i in range(2)]


def served(replica: ShardsService) -> int:
    return replica.committer.committed


async def test_ranks_follow_the_owner_and_fail_over_to_the_other_replica(
    settings: ServiceSettings, store: Store
) -> None:
    world, shards, epochs = 4, 200, 1
    job = "routed"
    await register(store, settings, job, world=world, shards=shards, epochs=epochs)
    runtimes, replicas, tokens = await two_replicas(settings, "host.r")
    owner_key = Keys(settings.etcd.key_prefix).owner("shards", job)
    ranks = await Ranks(settings, job, world).connect()
    try:
        # Warm up until every rank has a route: all of them name the same replica.
        owner_index = tokens.index(await ranks.converge())
        owner, other = replicas[owner_index], replicas[1 - owner_index]
        stored = await store.get(owner_key)
        assert stored is not None and stored.value.decode() == f"host.r{owner_index}"

        # Steady state: the owner serves every request, nothing contends. (The owner's
        # first write after the other's last one from the warm-up may conflict once.)
        await wait_for(lambda: other.committer.unwritten(job) == 0, what="the other's writes")
        await ranks.run(steps=3)
        await wait_for(lambda: owner.committer.unwritten(job) == 0, what="the owner's writes")
        before = [served(owner), served(other), owner.cas_conflicts + other.cas_conflicts]
        await ranks.run(steps=10)
        await wait_for(lambda: owner.committer.unwritten(job) == 0, what="the owner's writes")
        assert served(other) == before[1], "a rank that follows its route reached the other"
        assert served(owner) >= before[0] + world * 10
        assert owner.cas_conflicts + other.cas_conflicts == before[2]
        # Its metrics show the job's ledger from the owner only: the other's cached copy
        # (it has one when a warm-up request reached it: the queue group picks at random,
        # and all of them may go to the owner) is stale.
        stored_ledger = await ledger_in_etcd(store, settings, job)
        assert [(f.job, f.done) for f in owner.owned_ledgers()] == [(job, stored_ledger.done_count)]
        assert other.owned_ledgers() == []
        if served(other):
            assert job in other.committer.cache

        # The owner goes (drained, lease revoked): the ranks fall back to the queue group,
        # and a request that reaches the other replica once the owner's key is gone starts
        # its claim. A round of steps at a time until the claim is through: in one run the
        # ranks took the job's last shards first, and no reply ever named the other.
        await runtimes[owner_index].shutdown()

        async def claimed() -> bool:
            await ranks.run(steps=1)
            return other.routes.ownership.owns(job)

        await wait_for(claimed, what="the other replica's claim of the job")
        while len(ranks.fleet.finished) < world:
            await asyncio.wait_for(ranks.run(steps=5), 30)
        assert ranks.failures >= 1, "no rank noticed the owner had gone"
        assert other.routes.token in ranks.seen, "the other replica never took the job over"
        assert {r.route for r in ranks.routes} <= {other.routes.token, ""}

        # A finished job is given up: its owner key goes.
        async def released() -> bool:
            return await store.get(owner_key) is None

        await wait_for(released, what="the finished job's owner key gone")
    finally:
        await ranks.close()
        for runtime in runtimes:
            await runtime.shutdown()
    ranks.fleet.check_complete(shards, epochs)
    assert (await ledger_in_etcd(store, settings, job)).complete


async def test_checkpoint_commits_go_to_the_owner_and_fall_back_with_it(
    settings: ServiceSettings, store: Store
) -> None:
    """Every rank commits at once at a checkpoint: sent to the owner, as fetches are, the
    commits share its writes instead of splitting between two replicas that then contend.
    When the owner is gone, the agent's commit falls back to the queue group."""
    world, shards = 4, 80
    job = "routed-commits"
    await register(store, settings, job, world=world, shards=shards, epochs=1)
    runtimes, replicas, tokens = await two_replicas(settings, "host.c")
    ranks = await Ranks(settings, job, world).connect()
    try:
        owner_index = tokens.index(await ranks.converge())
        owner, other = replicas[owner_index], replicas[1 - owner_index]
        await wait_for(lambda: other.committer.unwritten(job) == 0, what="the other's writes")
        # The owner's first write after the other's last one from the warm-up may
        # conflict once (its cache is stale): let it happen before counting.
        await ranks.run(steps=1)
        await wait_for(lambda: owner.committer.unwritten(job) == 0, what="the owner's writes")
        before = [served(other), owner.cas_conflicts + other.cas_conflicts]

        async def commit(rank: int, step: int) -> CommitReply:
            request = ShardCommit(job=job, rank=rank, step=step, epoch=0)
            subject = ranks.routes[rank].subject_for("commit")
            return await ranks.buses[rank].request(subject, request, CommitReply, timeout=5)

        await asyncio.gather(*(commit(r, 10) for r in range(world)))
        replies = await asyncio.gather(*(commit(r, 10) for r in range(world)))  # as agents poll
        assert all(reply.complete for reply in replies), replies
        assert served(other) == before[0], "a commit that follows the route reached the other"
        assert owner.cas_conflicts + other.cas_conflicts == before[1]

        # The owner goes; each rank's agent commits the next checkpoint through its route,
        # finds no one there, and goes back to the queue group, where the other answers.
        await runtimes[owner_index].shutdown()
        loop = asyncio.get_running_loop()
        clients = []
        for rank in range(world):
            state = StreamState(job=job, rank=rank, seed=0, prefetch=1, shard_size=100)
            stream = ShardStream(state, bus=ranks.buses[rank], route=ranks.routes[rank], loop=loop)
            clients.append(LedgerClient(ranks.buses[rank], stream))
        replies = await asyncio.gather(*(c.commit(20, timeout_s=20) for c in clients))
        assert all(reply.complete and 20 in reply.checkpoints for reply in replies)
        assert all(r.route == "" and r.fallbacks == 1 for r in ranks.routes)
    finally:
        await ranks.close()
        for runtime in runtimes:
            await runtime.shutdown()


async def test_an_idle_job_is_given_up_and_claimed_again_by_its_next_request(
    settings: ServiceSettings, store: Store
) -> None:
    """A replica running for months must not keep the ledger and the owner key of every
    job it ever served: one nobody asked about for idle_job_s is dropped, and its next
    request loads it again, from etcd, where nothing was lost."""
    world, shards = 2, 30
    job = "idle-job"
    await register(store, settings, job, world=world, shards=shards, epochs=1)
    runtime = ServiceRuntime("replica-idle")
    replica_settings = ShardsSettings(
        **{**settings.model_dump(), "replica_id": "host.i0", "idle_job_s": 0.3}
    )
    replica: ShardsService = await start_service("shards", replica_settings, runtime)
    owner_key = Keys(settings.etcd.key_prefix).owner("shards", job)
    ranks = await Ranks(settings, job, world).connect()

    async def owner() -> str | None:
        stored = await store.get(owner_key)
        return stored.value.decode() if stored is not None else None

    async def given_up() -> bool:
        return await owner() is None and job not in replica.committer.cache

    try:
        assert await ranks.converge() == route_token("host.i0")
        assert await owner() == "host.i0" and job in replica.committer.cache
        await wait_for(given_up, timeout=10, what="the idle job given up")
        assert replica.idle_dropped == 1
        await ranks.run(steps=1)
        await wait_for(owner, timeout=10, what="the job claimed again")
        while len(ranks.fleet.finished) < world:
            await asyncio.wait_for(ranks.run(steps=5), 30)
    finally:
        await ranks.close()
        await runtime.shutdown()
    ranks.fleet.check_complete(shards, 1)
    assert (await ledger_in_etcd(store, settings, job)).complete


async def test_the_replica_taking_a_job_into_its_next_epoch_tells_the_waiting_ranks(
    settings: ServiceSettings, store: Store, bus: Bus
) -> None:
    """The replica that finished an epoch may die before it tells the ranks waiting for
    the next one (EpochFinished): they would each sleep until their next poll, 5 s apart
    in a job of a thousand ranks. So the replica that takes the job into the next epoch
    tells them, once. Here replica A finishes epoch 0 and goes before anyone listens;
    replica B, serving the first request for epoch 1, tells epoch 0's end, and later the
    job's end (the last epoch's), each once."""
    world, job = 2, "epoch-news"
    await register(store, settings, job, world=world, shards=4, epochs=2)
    first, second = ServiceRuntime("replica-a"), ServiceRuntime("replica-b")
    await start_replica(settings, "host.a", first)
    ranks = await Ranks(settings, job, world).connect()
    told: list[tuple[int, int]] = []

    async def on_told(event: EpochFinished, _: Delivery) -> None:
        told.append((event.epoch, event.incarnation))

    try:
        while in_epoch_0 := [r for r in range(world) if ranks.fleet.epoch.get(r, 0) == 0]:
            for rank in in_epoch_0:
                await asyncio.wait_for(ranks.step(rank), 30)
        assert (await ledger_in_etcd(store, settings, job)).epoch == 0  # finished, not turned
        await first.shutdown()
        await bus.subscribe(
            Subjects(settings.nats.subject_prefix).epoch_finished(job), EpochFinished, on_told
        )
        await start_replica(settings, "host.b", second)
        while len(ranks.fleet.finished) < world:
            await asyncio.wait_for(ranks.run(steps=1), 30)
        await wait_for(lambda: (1, 0) in told, what="the job's end told")
    finally:
        await ranks.close()
        await first.shutdown()
        await second.shutdown()
    assert told == [(0, 0), (1, 0)]
    ranks.fleet.check_complete(4, 2)


async def test_a_commit_refused_as_unavailable_is_tried_again(
    settings: ServiceSettings, store: Store
) -> None:
    """A replica that cannot reach etcd, or is draining for a restart, refuses with
    `unavailable`: the agent's commit (as its restore and release) tries again until its
    deadline, as its fetches do. (It gave up at once: a checkpoint taken while etcd
    restarted killed the training script, and the restarted job's restore the same.)"""
    job = "commit-unavailable"
    await register(store, settings, job, world=1, shards=4, epochs=1)
    runtime = ServiceRuntime("replica-u")
    replica = await start_replica(settings, "host.u0", runtime)
    ranks = await Ranks(settings, job, 1).connect()
    try:
        await ranks.run(steps=1)
        loop = asyncio.get_running_loop()
        state = StreamState(job=job, rank=0, seed=0, prefetch=1, shard_size=3)
        stream = ShardStream(state, bus=ranks.buses[0], route=ranks.routes[0], loop=loop)
        client = LedgerClient(ranks.buses[0], stream)

        def unavailable() -> int:
            counts = replica.bus.rejections.counts
            return sum(n for (_, code), n in counts.items() if code == "unavailable")

        refused_before = unavailable()
        # As while it drains: every ledger operation is refused `unavailable`.
        replica.committer._closed = True
        committing = asyncio.ensure_future(client.commit(5, timeout_s=20))
        await wait_for(lambda: unavailable() > refused_before, what="the commit refused")
        assert not committing.done()  # still trying
        replica.committer._closed = False  # etcd is back
        reply = await asyncio.wait_for(committing, 20)
        assert reply.complete and 5 in reply.checkpoints
    finally:
        await ranks.close()
        await runtime.shutdown()
