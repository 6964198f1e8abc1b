"""The shards group committer without servers: an in-memory store with etcd's CAS
semantics stands in for etcd, so batching, ordering, conflicts and failures can be
driven step by step (a gate holds a commit in flight)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from antdt.runtime.bus import Rejected
from antdt.schemas import ErrorCode, ErrorReply, FetchStatus, JobSpec, ShardFetch, ShardReply
from antdt.services.shards.budget import WriteBudget
from antdt.services.shards.change import LedgerChange, Writes
from antdt.services.shards.committer import Committer
from antdt.services.shards.ledger import LedgerState, apply_fetch, new_ledger
from antdt.services.shards.ops import fetch_op
from antdt.services.shards.stored import Committed, Snapshot
from tests.helpers import wait_for

JOB = "job1"


def ledger(world: int = 4, shards: int = 40, epochs: int = 1) -> LedgerState:
    spec = JobSpec(
        job=JOB,
        world_size=world,
        dataset_size=shards * 10,
        shard_size=10,
        global_batch=world,
        epochs=epochs,
    )
    return new_ledger(spec)


def fetch(rank: int, want: int = 1, done: tuple[Any, ...] = (), epoch: int = 0) -> Any:
    req = ShardFetch(job=JOB, rank=rank, epoch=epoch, done=done, want=want)
    return fetch_op(req)


@dataclass
class MemoryLedgers:
    """A LedgerStore over one in-memory value; CAS on a version, like etcd's."""

    state: LedgerState
    version: int = 1
    extra: dict[str, bytes] = field(default_factory=dict)
    gate: asyncio.Event | None = None
    fail_with: Exception | None = None
    writes: list[LedgerState | None] = field(default_factory=list)  # one per commit
    written_at: list[float] = field(default_factory=list)  # monotonic, one per commit
    calls: int = 0  # commits entered (a gated one is in flight)

    async def load(self, job: str) -> Snapshot:
        if job != JOB:
            raise Rejected(ErrorCode.UNKNOWN_JOB, job)
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
        self.written_at.append(time.monotonic())
        written = sum(len(value) for _, value in writes.puts())
        written += len(state.model_dump_json()) if state is not None else 0
        return Committed(True, Snapshot(self.state, self.version), written)

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


async def test_reserved_shards_go_out_before_the_write_and_dones_follow() -> None:
    store = MemoryLedgers(ledger(world=2, shards=80))
    c = committer(store, flush_interval_s=30.0)
    first = await c.submit(JOB, fetch_op(req(0, want=2), reserve=4))
    # New grants wait for their write; the 4 reserved with them are written at once too.
    assert len(first.grants) == 2 and c.early == 0
    await wait_for(lambda: len(store.state.in_flight) == 6, what="reservation written")
    writes = len(store.writes)
    refs = tuple(g.ref() for g in first.grants)
    reply = await asyncio.wait_for(
        c.submit(JOB, fetch_op(req(0, done=refs[:1], held=refs[1:]), reserve=4)), 5
    )
    # Handed out from the reservation: answered before any write, done not yet durable.
    assert c.early == 1 and len(store.writes) == writes
    assert reply.unconfirmed == refs[:1] and store.state.done_count == 0
    assert reply.grants[0].shard in {e.shard for e in store.state.in_flight if e.rank == 0}
    # The done mark follows with the next write (here forced by an answer that waits).
    await c.submit(JOB, fetch_op(req(1), reserve=0))
    assert store.state.done_count == 1


async def test_without_a_waiting_answer_the_write_comes_within_the_interval() -> None:
    store = MemoryLedgers(ledger(world=1, shards=80))
    c = committer(store, flush_interval_s=0.2)
    first = await c.submit(JOB, fetch_op(req(0), reserve=8))
    await wait_for(lambda: len(store.state.in_flight) == 9, what="reservation written")
    writes = len(store.writes)
    held = tuple(g.ref() for g in first.grants)
    reply = await c.submit(JOB, fetch_op(req(0, done=held), reserve=8))
    assert reply.unconfirmed == held and len(store.writes) == writes
    await wait_for(lambda: store.state.done_count == 1, what="the done written", timeout=5)
    assert len(store.writes) == writes + 1
    again = await c.submit(JOB, fetch_op(req(0, done=held, held=reply_refs(reply)), reserve=8))
    assert again.unconfirmed == ()  # durable now: the rank may forget it


async def test_done_marks_alone_wait_longer_for_their_write_than_reservations() -> None:
    store = MemoryLedgers(ledger(world=1, shards=80))
    c = committer(store, flush_interval_s=0.02, done_flush_interval_s=0.6)
    first = await c.submit(JOB, fetch_op(req(0), reserve=8))  # 1 grant, 8 reserved
    await wait_for(lambda: len(store.state.in_flight) == 9, what="reservation written")
    writes, held = len(store.writes), reply_refs(first)
    # Handed a reserved shard, 7 left: no top-up, only the done mark to write.
    started = time.monotonic()
    reply = await c.submit(JOB, fetch_op(req(0, done=held, held=held), reserve=8))
    assert reply.unconfirmed == held
    await wait_for(lambda: store.state.done_count == 1, what="the done written", timeout=5)
    assert time.monotonic() - started >= 0.5 and len(store.writes) == writes + 1
    # Hand out reserved shards until the rank is below half its reservation: the top-up
    # that follows is written within flush_interval_s, not the done marks' interval.
    seen = held + reply_refs(reply)
    while len(store.writes) == writes + 1:
        reply = await c.submit(JOB, fetch_op(req(0, done=reply_refs(reply), held=seen), reserve=8))
        seen += reply_refs(reply)
        if c.working(JOB).cursor > store.state.cursor:  # type: ignore[union-attr]  # topped up
            topped_up = time.monotonic()
            await wait_for(lambda: len(store.writes) > writes + 1, what="top-up written")
            assert time.monotonic() - topped_up < 0.3
            break
    else:
        raise AssertionError("a done mark was written before the top-up")


async def test_an_early_answer_waits_when_its_reservation_is_not_durable_yet() -> None:
    store = MemoryLedgers(ledger(world=1, shards=80), gate=asyncio.Event())
    c = committer(store, flush_interval_s=30.0)
    first = c.enqueue(JOB, fetch_op(req(0), reserve=4))
    await in_commit(store)  # the grant and its reservation are being written
    second = c.enqueue(JOB, fetch_op(req(0, held=(), want=1), reserve=4))
    await asyncio.sleep(0.01)
    assert not second.done()  # it hands out a reserved shard not yet durable
    store.gate.set()  # type: ignore[union-attr]
    out = await settled(first, second)
    assert all(isinstance(r, ShardReply) for r in out) and c.early == 0


async def test_a_job_s_writes_keep_to_its_write_budget() -> None:
    """Each answer waits on a write (new grants); with a budget of one ledger per 0.2 s
    the requests that come within that share the next write instead of one each."""
    store = MemoryLedgers(ledger(world=4, shards=400))
    size = len(store.state.model_dump_json())
    c = committer(store, write_bytes_per_s=size / 0.2, write_burst_s=0.0)
    await c.submit(JOB, fetch(0))
    started = time.monotonic()
    spread = []
    for rank in (1, 2, 3):
        spread.append(c.enqueue(JOB, fetch(rank)))
        await asyncio.sleep(0.03)
    replies = await asyncio.wait_for(asyncio.gather(*spread), 5)
    assert all(isinstance(r, ShardReply) and r.grants for r in replies)
    assert len(store.writes) == 2  # the first request's, then one for the three
    # The first write (a ledger at least as big as the empty one) bought 0.2 s or more.
    assert store.written_at[1] - store.written_at[0] >= 0.19
    assert time.monotonic() - started >= 0.15 and c.budget_waits == 1
    # Without a budget the same spread costs a write each.
    free = MemoryLedgers(ledger(world=4, shards=400))
    unpaced = committer(free)
    await unpaced.submit(JOB, fetch(0))
    for rank in (1, 2, 3):
        await unpaced.submit(JOB, fetch(rank))
    assert len(free.writes) == 4 and unpaced.budget_waits == 0


async def test_writes_within_the_burst_do_not_wait() -> None:
    store = MemoryLedgers(ledger(world=4, shards=400))
    size = len(store.state.model_dump_json())
    # The bucket holds about 6 writes: the first few go at once, then writes are paced.
    c = committer(store, write_bytes_per_s=size / 0.2, write_burst_s=1.2)
    started = time.monotonic()
    for rank in (0, 1, 2):
        await c.submit(JOB, fetch(rank))
    assert time.monotonic() - started < 0.15 and c.budget_waits == 0
    for _ in range(6):
        await c.submit(JOB, fetch(3))
    assert c.budget_waits > 0 and time.monotonic() - started >= 0.3


async def test_shutting_down_writes_at_once_whatever_the_budget() -> None:
    store = MemoryLedgers(ledger(world=2))
    c = committer(store, write_bytes_per_s=1.0, write_burst_s=0.0)  # the next: hours
    await c.submit(JOB, fetch(0))
    held = c.enqueue(JOB, fetch(1))
    await asyncio.sleep(0.05)
    assert not held.done() and len(store.writes) == 1
    await asyncio.wait_for(c.finish(), 5)
    assert isinstance(held.result(), ShardReply) and len(store.writes) == 2


def req(rank: int, want: int = 1, done: tuple[Any, ...] = (), held: tuple[Any, ...] = ()) -> Any:
    return ShardFetch(job=JOB, rank=rank, epoch=0, done=done, want=want, held=held)


def reply_refs(reply: Any) -> tuple[Any, ...]:
    return tuple(g.ref() for g in reply.grants)


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


async def test_an_idle_job_is_forgotten_only_when_nothing_is_in_progress() -> None:
    store = MemoryLedgers(ledger())
    store.gate = asyncio.Event()
    c = committer(store)
    pending = asyncio.ensure_future(c.submit(JOB, fetch(0)))  # a new grant: waits on a write
    await in_commit(store)
    far = time.monotonic() + 3600
    assert c.idle_jobs(far, idle_s=1) == [] and not c.forget(JOB, far, idle_s=1)
    store.gate.set()
    first = await pending
    await wait_for(lambda: c._jobs[JOB].task is None, what="commit task done")
    now = time.monotonic()
    assert c.idle_jobs(now, idle_s=60) == []  # asked just now
    assert c.idle_jobs(now + 61, idle_s=60) == [JOB]
    assert c.forget(JOB, now + 61, idle_s=60) and JOB not in c.cache
    # Forgotten, not lost: the next request loads what was written and carries on.
    again = await c.submit(JOB, fetch(0, done=reply_refs(first)))
    assert again.grants[0].shard != first.grants[0].shard and store.state.done_count == 1


def put_op(key: str, value: bytes = b"v", delete: str | None = None) -> Any:
    def op(state: LedgerState) -> LedgerChange:
        deletes = (delete,) if delete else ()
        reply: ErrorReply | ShardReply = ShardReply(job=JOB, epoch=0, status=FetchStatus.OK)
        if key == "!":
            reply = ErrorReply(error="x", code=ErrorCode.BAD_REQUEST)
        return LedgerChange(state, reply, puts=((key, value),), deletes=deletes)

    return op


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


async def _two_replicas(
    schedule: list[tuple[int, int, int, bool]], reserve: int | None = None, interval: float = 0
) -> None:
    store = MemoryLedgers(ledger(world=4, shards=12 if reserve is None else 60))
    made = [committer(store, flush_interval_s=interval) for _ in range(2)]
    fleet = Fleet(made, reserve=reserve)
    for wave in waves(schedule):
        await fleet.send(wave)
    for round_ in range(20):  # then every rank finishes what it holds, replicas alternating
        if store.state.complete:
            break
        await fleet.send([(round_ % 2, rank, 3) for rank in range(4)])
    assert store.state.complete, "the job did not finish"
    shards = set(range(store.state.num_shards))
    assert fleet.completed == shards and set(fleet.holder) == shards


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules, st.integers(1, 4), st.sampled_from([0.0, 0.001, 0.02]))
def test_two_replicas_answering_early_never_grant_a_shard_twice(
    schedule: list[tuple[int, int, int, bool]], reserve: int, interval: float
) -> None:
    """The same, with ranks that say what they hold: replicas reserve shards ahead and
    hand them out before writing; done marks are written behind and re-sent until a reply
    no longer lists them as unconfirmed."""
    asyncio.run(_two_replicas(schedule, reserve=reserve, interval=interval))


@dataclass
class Fleet:
    """Ranks that report what they hold as done and ask for more, through any replica;
    checks on every reply that no shard was ever granted to two ranks."""

    replicas: list[Committer]
    reserve: int | None = None  # None: ranks do not say what they hold
    holder: dict[int, int] = field(default_factory=dict)  # shard -> rank granted it
    unconfirmed: dict[int, tuple[Any, ...]] = field(
        default_factory=lambda: dict.fromkeys(range(4), ())
    )
    held: dict[int, tuple[Any, ...]] = field(default_factory=lambda: dict.fromkeys(range(4), ()))
    epoch: dict[int, int] = field(default_factory=lambda: dict.fromkeys(range(4), 0))
    completed: set[int] = field(default_factory=set)

    def op(self, rank: int, want: int, done: tuple[Any, ...], epoch: int) -> Any:
        if self.reserve is None:
            return fetch(rank, want, done, epoch)
        report = tuple(dict.fromkeys(self.unconfirmed[rank] + done))
        request = ShardFetch(job=JOB, rank=rank, epoch=epoch, done=report, want=want, held=())
        return fetch_op(request, self.reserve)

    async def send(self, wave: list[tuple[int, int, int]]) -> None:
        sent = [(rank, self.held[rank], self.epoch[rank]) for _, rank, _ in wave]
        futures = [
            self.replicas[replica].enqueue(JOB, self.op(rank, want, done, epoch))
            for (replica, _, want), (rank, done, epoch) in zip(wave, sent, strict=True)
        ]
        for (rank, done, epoch), result in zip(sent, await settled(*futures), strict=True):
            assert not isinstance(result, Exception), result
            self.completed |= {ref.shard for ref in done}
            for grant in result.grants:
                assert self.holder.setdefault(grant.shard, rank) == rank, "granted twice"
            reported = {ref.shard for ref in done}
            self.held[rank] = tuple(g.ref() for g in result.grants if g.shard not in reported)
            self.unconfirmed[rank] = result.unconfirmed
            if result.status == FetchStatus.EPOCH_DONE and not result.grants:
                self.epoch[rank] = epoch + 1  # ask for the next epoch: JOB_DONE at the end


def test_a_write_budget_lets_a_burst_through_then_holds_until_back_at_zero() -> None:
    budget = WriteBudget(bytes_per_s=1000, burst_s=2.0)
    assert budget.due() == 0.0  # a full bucket: 2000 bytes
    budget.spend(1500, now=10.0)
    assert budget.due() == 0.0  # 500 left
    budget.spend(1000, now=10.0)
    assert budget.due() == 10.5  # 500 in debt, at 1000 bytes/s
    budget.spend(0, now=10.5)
    assert budget.tokens == 0.0 and budget.due() == 0.0
    budget.spend(100, now=100.0)  # refilled only up to the burst
    assert budget.tokens == 1900.0
