"""The shards group committer without servers: an in-memory store with etcd's CAS
semantics stands in for etcd, so batching, ordering, conflicts and failures can be
driven step by step (a gate holds a commit in flight)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from antdt.runtime.bus import Rejected
from antdt.schemas import ErrorReply, FetchStatus, JobSpec, ShardFetch, ShardReply
from antdt.services.shards.change import LedgerChange, Writes, change_of
from antdt.services.shards.committer import Committed, Committer, Snapshot, apply_batch
from antdt.services.shards.ledger import LedgerState, apply_fetch, new_ledger
from tests.helpers import wait_for

JOB = "job1"


def ledger(world: int = 4, shards: int = 40, epochs: int = 1) -> LedgerState:
    spec = JobSpec(job=JOB, world_size=world, dataset_size=shards * 10, shard_size=10,
                   global_batch=world, epochs=epochs)  # fmt: skip
    return new_ledger(spec)


def fetch(rank: int, want: int = 1, done: tuple[Any, ...] = (), epoch: int = 0) -> Any:
    req = ShardFetch(job=JOB, rank=rank, epoch=epoch, done=done, want=want)
    return lambda state: change_of(apply_fetch(state, req))


@dataclass
class MemoryLedgers:
    """A LedgerStore over one in-memory value; CAS on a version, like etcd's."""

    state: LedgerState
    version: int = 1
    extra: dict[str, bytes] = field(default_factory=dict)
    gate: asyncio.Event | None = None
    fail_with: Exception | None = None
    writes: list[LedgerState | None] = field(default_factory=list)  # one per commit
    calls: int = 0  # commits entered (a gated one is in flight)

    async def load(self, job: str) -> Snapshot:
        if job != JOB:
            raise Rejected("unknown_job", job)
        return Snapshot(self.state, self.version)

    async def commit(
        self, job: str, base: Snapshot, state: LedgerState | None, writes: Writes
    ) -> Committed:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0)  # another committer may slip in here, as over a network
        if self.fail_with is not None:
            raise self.fail_with
        if base.token != self.version:
            return Committed(False, Snapshot(self.state, self.version))
        if state is not None:
            self.state, self.version = state, self.version + 1
        for key in writes.deletes():
            self.extra.pop(key, None)
        self.extra.update(writes.puts())
        self.writes.append(state)
        return Committed(True, Snapshot(self.state, self.version))

    def other_replica_writes(self, state: LedgerState) -> None:
        self.state, self.version = state, self.version + 1


def committer(store: MemoryLedgers, **kw: Any) -> Committer:
    return Committer(store, lambda name, coro: asyncio.create_task(coro, name=name), **kw)


async def in_commit(store: MemoryLedgers, calls: int = 1) -> None:
    await wait_for(lambda: store.calls >= calls, what=f"{calls} commit(s) in flight")


async def settled(*futures: asyncio.Future[BaseModel]) -> list[Any]:
    return await asyncio.gather(*futures, return_exceptions=True)


async def test_requests_queued_during_a_commit_share_the_next_one() -> None:
    store = MemoryLedgers(ledger(), gate=asyncio.Event())
    c = committer(store)
    first = c.enqueue(JOB, fetch(0))
    await in_commit(store)  # the first commit is now held in flight by the gate
    queued = [c.enqueue(JOB, fetch(rank)) for rank in (1, 2, 3)]
    await asyncio.sleep(0)
    assert not first.done() and not any(f.done() for f in queued)  # nothing before durable
    store.gate.set()  # type: ignore[union-attr]
    replies = await settled(first, *queued)
    assert c.commits == 2 and dict(c.batch_sizes) == {1: 1, 3: 1}
    assert c.requests_per_commit == 2.0 and len(store.writes) == 2
    # Arrival order is grant order: the ledger's order hands out positions 0, 1, 2, 3.
    granted = [r.grants[0].shard for r in replies]
    assert [e.shard for e in store.state.in_flight] == granted
    assert store.state.cursor == 4 and store.version == 3


async def test_a_conflict_re_applies_the_batch_to_the_state_read_back() -> None:
    store = MemoryLedgers(ledger())
    c = committer(store)
    await c.submit(JOB, fetch(0))  # warms the cache
    theirs, _ = apply_fetch(store.state, ShardFetch(job=JOB, rank=1, epoch=0, want=2))
    store.other_replica_writes(theirs)  # our cache is stale now
    reply = await c.submit(JOB, fetch(2))
    assert c.cas_conflicts == 1
    assert isinstance(reply, ShardReply)
    others = {e.shard for e in theirs.in_flight if e.rank != 2}
    assert reply.grants[0].shard not in others and store.state.cursor == 4


async def test_rejections_leave_the_state_alone_and_wait_for_the_commit() -> None:
    store = MemoryLedgers(ledger())
    c = committer(store)
    await c.submit(JOB, fetch(0))
    store.gate = asyncio.Event()
    bad = c.enqueue(JOB, fetch(9))  # rank outside the job
    good = c.enqueue(JOB, fetch(1))
    await in_commit(store, 2)  # the batch (bad, good) is judged and being committed
    assert not bad.done()  # judged on a cache that only the commit can confirm
    store.gate.set()
    results = await settled(bad, good)
    assert isinstance(results[0], Rejected) and results[0].code == "bad_request"
    assert isinstance(results[1], ShardReply)
    assert store.state.cursor == 2 and c.batch_sizes[2] == 1


async def test_a_batch_of_no_ops_and_rejections_is_only_checked() -> None:
    store = MemoryLedgers(ledger())
    c = committer(store)
    await c.submit(JOB, fetch(0, want=0))  # nothing to grant: the state does not change
    with pytest.raises(Rejected, match="outside world size"):
        await c.submit(JOB, fetch(7))
    assert store.writes == [None, None] and store.version == 1 and c.commits == 2


async def test_a_stale_cache_cannot_reject_what_the_real_state_accepts() -> None:
    store = MemoryLedgers(ledger())
    c = committer(store)
    await c.submit(JOB, fetch(0))
    # Another replica granted shards to rank 1; rank 1 now reports them done here.
    theirs, reply = apply_fetch(store.state, ShardFetch(job=JOB, rank=1, epoch=0, want=1))
    store.other_replica_writes(theirs)
    assert isinstance(reply, ShardReply)
    done = tuple(g.ref() for g in reply.grants)
    answer = await c.submit(JOB, fetch(1, want=0, done=done))
    assert isinstance(answer, ShardReply) and store.state.done_count == 1


async def test_contention_beyond_the_retries_answers_busy() -> None:
    store = MemoryLedgers(ledger())
    c = committer(store, retries=3)
    original = store.commit

    async def always_lose(*args: Any) -> Committed:
        store.version += 1  # someone else always wrote first
        return await original(*args)

    store.commit = always_lose  # type: ignore[method-assign]
    with pytest.raises(Rejected) as refused:
        await c.submit(JOB, fetch(0))
    assert refused.value.code == "busy" and c.cas_conflicts == 3


async def test_store_failures_and_unknown_jobs_are_answered_not_raised() -> None:
    store = MemoryLedgers(ledger(), fail_with=ConnectionError("etcd down"))
    c = committer(store)
    with pytest.raises(Rejected) as down:
        await c.submit(JOB, fetch(0))
    assert down.value.code == "unavailable" and JOB not in c.cache
    store.fail_with = None
    assert isinstance(await c.submit(JOB, fetch(0)), ShardReply)
    with pytest.raises(Rejected, match="nope"):
        await c.submit("nope", fetch(0))


async def test_a_failing_operation_does_not_fail_its_batch() -> None:
    store = MemoryLedgers(ledger(), gate=asyncio.Event())
    c = committer(store)

    def broken(state: LedgerState) -> LedgerChange:
        raise KeyError("bug")

    first = c.enqueue(JOB, fetch(0))
    await in_commit(store)
    results = [c.enqueue(JOB, broken), c.enqueue(JOB, fetch(1))]
    store.gate.set()  # type: ignore[union-attr]
    out = await settled(first, *results)
    assert isinstance(out[1], KeyError) and isinstance(out[2], ShardReply)


async def test_with_several_ranks_active_a_commit_waits_for_them() -> None:
    store = MemoryLedgers(ledger(), gate=asyncio.Event())
    c = committer(store, linger_s=30.0)
    first = c.enqueue(JOB, fetch(0))
    await in_commit(store)
    queued = [c.enqueue(JOB, fetch(rank)) for rank in (1, 2)]
    store.gate.set()  # type: ignore[union-attr]
    await settled(first, *queued)
    assert dict(c.batch_sizes) == {1: 1, 2: 1}
    # Two ranks were active: the next commit waits (up to 30 s) for the second one.
    lone = c.enqueue(JOB, fetch(0))
    await wait_for(lambda: c._jobs[JOB].expected == 2, what="the commit waiting for 2")
    assert not lone.done() and c.commits == 2
    await asyncio.wait_for(settled(lone, c.enqueue(JOB, fetch(1))), 5)
    assert c.batch_sizes[2] == 2 and c.commits == 3


async def test_a_lone_rank_never_waits_and_the_wait_is_bounded() -> None:
    store = MemoryLedgers(ledger())
    c = committer(store, linger_s=30.0)
    for _ in range(3):  # the previous batch was 1: no wait, or this would take 30 s each
        await asyncio.wait_for(c.submit(JOB, fetch(0)), 5)
    c.linger_s = 0.05
    c._jobs[JOB].last_batch = 4  # as after a batch of four ranks
    assert isinstance(await asyncio.wait_for(c.submit(JOB, fetch(1)), 5), ShardReply)


async def test_a_finished_job_is_forgotten_and_reloaded_on_demand() -> None:
    store = MemoryLedgers(ledger(world=1, shards=2))
    c = committer(store)
    reply = await c.submit(JOB, fetch(0, want=2))
    done = tuple(g.ref() for g in reply.grants)
    assert JOB in c.cache
    await c.submit(JOB, fetch(0, want=0, done=done))  # the last shard of the last epoch
    assert store.state.complete
    await wait_for(lambda: JOB not in c.cache and JOB not in c._jobs, what="job forgotten")
    late = await c.submit(JOB, fetch(0, epoch=1))
    assert late.status == FetchStatus.JOB_DONE and store.version == 3


def put_op(key: str, value: bytes = b"v", delete: str | None = None) -> Any:
    def op(state: LedgerState) -> LedgerChange:
        deletes = (delete,) if delete else ()
        return LedgerChange(state, ErrorReply(error="x", code="n") if key == "!" else
                            ShardReply(job=JOB, epoch=0, status=FetchStatus.OK),
                            puts=((key, value),), deletes=deletes)  # fmt: skip

    return op


def test_apply_batch_merges_writes_and_splits_at_the_transaction_limit() -> None:
    state = ledger()
    ops = [put_op("a"), put_op("b", delete="a"), put_op("!"), put_op("c"), put_op("d")]
    result = apply_batch(state, ops, max_writes=3)
    assert result.applied == 4  # "d" would make four keys: it waits for the next batch
    assert result.writes.puts() == [("b", b"v"), ("c", b"v")]
    assert result.writes.deletes() == ["a"]
    assert isinstance(result.outcomes[2], LedgerChange) and result.outcomes[2].rejected
    assert apply_batch(state, ops[4:], max_writes=0).applied == 1  # one op always goes


async def test_extra_writes_beyond_the_limit_go_in_the_next_commit() -> None:
    store = MemoryLedgers(ledger(), gate=asyncio.Event())
    c = committer(store, max_writes=2)
    first = c.enqueue(JOB, put_op("k0"))
    await in_commit(store)
    rest = [c.enqueue(JOB, put_op(f"k{i}")) for i in range(1, 5)]
    store.gate.set()  # type: ignore[union-attr]
    await settled(first, *rest)
    assert sorted(store.extra) == [f"k{i}" for i in range(5)]
    assert dict(c.batch_sizes) == {1: 1, 2: 2}


async def test_finish_completes_queued_work_then_refuses() -> None:
    store = MemoryLedgers(ledger(), gate=asyncio.Event())
    c = committer(store)
    pending = [c.enqueue(JOB, fetch(rank)) for rank in range(3)]
    finishing = asyncio.create_task(c.finish())
    await wait_for(lambda: c._closed, what="finish started")
    with pytest.raises(Rejected, match="shutting down"):
        c.enqueue(JOB, fetch(0))
    store.gate.set()  # type: ignore[union-attr]
    await finishing
    assert all(isinstance(r, ShardReply) for r in await settled(*pending))


# --- two committers (replicas) sharing one store, any interleaving ---------------------

schedules = st.lists(
    st.tuples(st.integers(0, 1), st.integers(0, 3), st.integers(0, 3), st.booleans()),
    min_size=1,
    max_size=40,
)


def waves(schedule: list[tuple[int, int, int, bool]]) -> Iterator[list[tuple[int, int, int]]]:
    """Split a schedule into waves of requests sent at once (a True flag ends a wave)."""
    wave: list[tuple[int, int, int]] = []
    for replica, rank, want, ends in schedule:
        wave.append((replica, rank, want))
        if ends:
            yield wave
            wave = []
    if wave:
        yield wave


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules)
def test_two_replicas_never_grant_a_shard_twice(schedule: list[tuple[int, int, int, bool]]) -> None:
    asyncio.run(_two_replicas(schedule))


async def _two_replicas(schedule: list[tuple[int, int, int, bool]]) -> None:
    store = MemoryLedgers(ledger(world=4, shards=12))
    fleet = Fleet([committer(store), committer(store)])
    for wave in waves(schedule):
        await fleet.send(wave)
    for round_ in range(20):  # then every rank finishes what it holds, replicas alternating
        if store.state.complete:
            break
        await fleet.send([(round_ % 2, rank, 3) for rank in range(4)])
    assert store.state.complete, "the job did not finish"
    assert fleet.completed == set(range(12)) and set(fleet.holder) == set(range(12))


@dataclass
class Fleet:
    """Ranks that report what they hold as done and ask for more, through any replica;
    checks on every reply that no shard was ever granted to two ranks."""

    replicas: list[Committer]
    holder: dict[int, int] = field(default_factory=dict)  # shard -> rank granted it
    held: dict[int, tuple[Any, ...]] = field(default_factory=lambda: dict.fromkeys(range(4), ()))
    epoch: dict[int, int] = field(default_factory=lambda: dict.fromkeys(range(4), 0))
    completed: set[int] = field(default_factory=set)

    async def send(self, wave: list[tuple[int, int, int]]) -> None:
        sent = [(rank, self.held[rank], self.epoch[rank]) for _, rank, _ in wave]
        futures = [
            self.replicas[replica].enqueue(JOB, fetch(rank, want, done, epoch))
            for (replica, _, want), (rank, done, epoch) in zip(wave, sent, strict=True)
        ]
        for (rank, done, epoch), result in zip(sent, await settled(*futures), strict=True):
            assert not isinstance(result, Exception), result
            self.completed |= {ref.shard for ref in done}
            for grant in result.grants:
                assert self.holder.setdefault(grant.shard, rank) == rank, "granted twice"
            reported = {ref.shard for ref in done}
            self.held[rank] = tuple(g.ref() for g in result.grants if g.shard not in reported)
            if result.status == FetchStatus.EPOCH_DONE and not result.grants:
                self.epoch[rank] = epoch + 1  # ask for the next epoch: JOB_DONE at the end
