"""Checkpoint commit, restore and release through the real shards service (nats-server,
etcd): snapshots stored at their own keys and pruned, restores, fencing of an older
incarnation, operator release, and bad input refused with nothing changed."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from rich.console import Console

from antdt.cli.shards import render_status
from antdt.runtime.bus import Bus, Delivery, RequestRefused
from antdt.runtime.store import Store
from antdt.schemas import (
    CommitReply,
    EpochFinished,
    FetchStatus,
    JobSpec,
    Keys,
    RegisterReply,
    ReleaseReply,
    RestoreReply,
    ShardCommit,
    ShardFetch,
    ShardPosition,
    ShardRelease,
    ShardReply,
    ShardRestore,
    ShardsReturned,
    ShardStatus,
    ShardStatusRequest,
    Subjects,
)
from antdt.services.shards.state import LedgerState
from tests.e2e.conftest import RunningServices, start_services
from tests.helpers import refusal, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
async def running(settings):  # type: ignore[no-untyped-def]
    services = await start_services(settings, names=("controller", "shards"))
    yield services
    await services.runtime.shutdown()


async def status(bus: Bus, job: str) -> ShardStatus:
    subjects = Subjects(bus.settings.subject_prefix)
    return await bus.request(
        subjects.shards(job, "status"), ShardStatusRequest(job=job), ShardStatus
    )


async def registered(bus: Bus, job: str) -> Subjects:
    subjects = Subjects(bus.settings.subject_prefix)
    spec = JobSpec(job=job, world_size=2, dataset_size=100, shard_size=10, global_batch=8)
    await bus.request(subjects.register(job), spec, RegisterReply)
    return subjects


async def test_commit_restore_and_fencing_through_the_service(
    running: RunningServices, bus: Bus, store: Store
) -> None:
    job = "ck1"
    subjects = await registered(bus, job)
    fetch, commit = subjects.shards(job, "fetch"), subjects.shards(job, "commit")
    grants = {}
    for rank in (0, 1):
        reply = await bus.request(
            fetch, ShardFetch(job=job, rank=rank, epoch=0, want=2), ShardReply
        )
        grants[rank] = reply.grants
    g = grants[0][0]
    pos = ShardPosition(epoch=0, shard=g.shard, attempt=g.attempt, position=4)
    first = await bus.request(
        commit, ShardCommit(job=job, rank=0, step=9, epoch=0, positions=(pos,)), CommitReply
    )
    assert not first.complete and first.waiting_for == (1,)
    pending = await status(bus, job)
    assert pending.pending_checkpoint == 9 and pending.committed_ranks == (0,)
    done = await bus.request(commit, ShardCommit(job=job, rank=1, step=9, epoch=0), CommitReply)
    assert done.complete and done.checkpoints == (9,)
    stored = await store.get_model(
        Keys(running_prefix(running)).ledger_checkpoint(job, 9), LedgerState
    )
    assert stored is not None and {(e.shard, e.position) for e in stored[0].in_flight} >= {
        (g.shard, 4)
    }

    # the rank trains on past the checkpoint, then the job restarts from it
    await bus.request(
        fetch, ShardFetch(job=job, rank=0, epoch=0, done=(g.ref(),), want=1), ShardReply
    )
    restore = subjects.shards(job, "restore")
    replies = [
        await bus.request(
            restore, ShardRestore(job=job, rank=r, token="run2", step=9), RestoreReply
        )
        for r in (0, 1)
    ]
    assert [r.restored for r in replies] == [True, False] and replies[0].incarnation == 1
    back = await status(bus, job)
    assert (0, g.shard, g.attempt + 1, 4) in {
        (e.rank, e.shard, e.attempt, e.position) for e in back.in_flight
    }
    with pytest.raises(RequestRefused, match="incarnation"):  # an old process is fenced
        await bus.request(fetch, ShardFetch(job=job, rank=1, epoch=0), ShardReply)
    resumed = await bus.request(
        fetch, ShardFetch(job=job, rank=0, epoch=0, incarnation=1, want=0), ShardReply
    )
    assert any(x.shard == g.shard and x.position == 4 for x in resumed.grants)
    text = render(back)
    assert "incarnation 1" in text and f"{g.shard}@4" in text and "checkpoints (steps): 9" in text

    async def owned() -> ShardStatus | None:  # claimed on the first fetch, in the background
        now = await status(bus, job)
        return now if now.owner else None

    replica = running.by_name["shards"].settings.replica_id
    assert (await wait_for(owned, what="an owner")).owner == replica
    assert f"served by {replica}" in render(await status(bus, job))


def running_prefix(running: RunningServices) -> str:
    return running.by_name["shards"].settings.etcd.key_prefix


def render(s: ShardStatus) -> str:
    console = Console(record=True, width=120)
    console.print(render_status(s))
    return console.export_text()


async def test_operator_release_hands_a_dead_ranks_shards_back(
    running: RunningServices, bus: Bus
) -> None:
    job = "ck2"
    subjects = await registered(bus, job)
    fetch = subjects.shards(job, "fetch")
    held = await bus.request(fetch, ShardFetch(job=job, rank=1, epoch=0, want=2), ShardReply)
    release = subjects.shards(job, "release")
    reply = await bus.request(
        release, ShardRelease(job=job, rank=1, reason="node lost"), ReleaseReply
    )
    assert reply.returned == 2
    taken = await bus.request(fetch, ShardFetch(job=job, rank=0, epoch=0, want=2), ShardReply)
    assert {g.shard for g in taken.grants} == {g.shard for g in held.grants}
    assert all(g.attempt == 1 for g in taken.grants)
    assert (await status(bus, job)).left == (1,)
    assert "removed ranks: 1" in render(await status(bus, job))


async def test_hand_backs_are_announced_at_once_and_then_at_most_once_a_second(
    running: RunningServices, bus: Bus
) -> None:
    """A release that hands shards back is announced (ShardsReturned) after its write;
    releases within the second after an announcement go out together at its end, so a
    shrink of many ranks wakes each waiting rank about once a second, not once per rank;
    a release that hands nothing back is not announced."""
    job = "ck-returned"
    subjects = Subjects(bus.settings.subject_prefix)
    spec = JobSpec(job=job, world_size=5, dataset_size=100, shard_size=10, global_batch=10)
    await bus.request(subjects.register(job), spec, RegisterReply)
    told: list[tuple[float, ShardsReturned]] = []

    async def on_returned(event: ShardsReturned, _: Delivery) -> None:
        told.append((time.monotonic(), event))

    await bus.subscribe(subjects.shards_returned(job), ShardsReturned, on_returned)
    fetch, release = subjects.shards(job, "fetch"), subjects.shards(job, "release")
    for rank in (1, 2, 3):
        await bus.request(fetch, ShardFetch(job=job, rank=rank, epoch=0, want=2), ShardReply)
    started = time.monotonic()
    for rank in (1, 2, 3, 4):  # rank 4 holds nothing
        reply = await bus.request(release, ShardRelease(job=job, rank=rank), ReleaseReply)
        assert reply.returned == (0 if rank == 4 else 2)
    await wait_for(lambda: len(told) == 2, what="two announcements")
    (first_at, first), (second_at, second) = told
    assert (first.ranks, first.returned) == ((1,), 2)
    assert (second.ranks, second.returned) == ((2, 3), 4)
    assert first_at - started < 1.0 and 0.8 < second_at - first_at < 2.0
    await asyncio.sleep(1.2)
    assert len(told) == 2  # nothing more: rank 4 handed nothing back


async def test_bad_ledger_requests_are_refused_and_change_nothing(
    running: RunningServices, bus: Bus
) -> None:
    job = "ck3"
    subjects = await registered(bus, job)
    fetch = subjects.shards(job, "fetch")
    g = (await bus.request(fetch, ShardFetch(job=job, rank=0, epoch=0, want=1), ShardReply)).grants[
        0
    ]
    before = await status(bus, job)

    def commit(**kw: object) -> bytes:
        fields = {"job": job, "rank": 0, "step": 3, "epoch": 0, **kw}
        return json.dumps(fields).encode()

    def position(p: int, shard: int = g.shard, attempt: int = 0) -> dict[str, int]:
        return {"epoch": 0, "shard": shard, "attempt": attempt, "position": p}

    replies = {"commit": CommitReply, "restore": RestoreReply, "release": ReleaseReply}
    cases = {
        "commit": [
            b"{not json",
            commit(surprise=1),
            commit(positions=[position(-1)]),  # negative
            commit(positions=[position(11)]),  # past the shard's end
            commit(positions=[position(2, shard=(g.shard + 1) % 10)]),  # not this rank's
            commit(positions=[position(2, attempt=3)]),  # another attempt's
            commit(epoch=1),  # stale epoch
            commit(job="other"),  # the subject names another job
            json.dumps({"job": "nojob", "rank": 0, "step": 1, "epoch": 0}).encode(),
        ],
        "restore": [
            json.dumps({"job": job, "rank": 0, "token": "t", "step": 77}).encode(),  # no snapshot
            json.dumps({"job": job, "rank": 0, "token": "bad token!", "step": None}).encode(),
        ],
        "release": [
            json.dumps({"job": job, "rank": 9}).encode(),
            json.dumps({"job": job, "rank": 0, "positions": [position(50)]}).encode(),
        ],
    }
    for verb, raws in cases.items():
        for raw in raws:
            answer = await refusal(bus, subjects.shards(job, verb), raw, replies[verb])
            assert answer.code != "ok" and answer.error, (verb, raw)
    assert await status(bus, job) == before
    with pytest.raises(RequestRefused, match="unknown_job"):
        await bus.request(
            subjects.shards("nojob", "commit"),
            ShardCommit(job="nojob", rank=0, step=1, epoch=0),
            CommitReply,
        )
    ok = await bus.request(fetch, ShardFetch(job=job, rank=0, epoch=0, want=0), ShardReply)
    assert ok.status == FetchStatus.OK  # and the service keeps serving


async def test_a_commit_whose_done_refs_finish_the_job_announces_its_end(
    running: RunningServices, bus: Bus
) -> None:
    """The last shards' done refs may come with a checkpoint commit instead of a fetch.
    The write that completes the job drops its ledger from the replica's cache; the
    ranks waiting to leave the last epoch are still told at once (EpochFinished), not at
    their next poll."""
    job = "ck-end"
    subjects = Subjects(bus.settings.subject_prefix)
    spec = JobSpec(job=job, world_size=2, dataset_size=30, shard_size=10, global_batch=4)
    await bus.request(subjects.register(job), spec, RegisterReply)
    told: list[EpochFinished] = []

    async def on_end(event: EpochFinished, _: object) -> None:
        told.append(event)

    await bus.subscribe(subjects.epoch_finished(job), EpochFinished, on_end)
    await bus.flush()
    fetch, commit = subjects.shards(job, "fetch"), subjects.shards(job, "commit")
    reply = await bus.request(fetch, ShardFetch(job=job, rank=0, epoch=0, want=3), ShardReply)
    assert len(reply.grants) == 3  # rank 0 holds the whole epoch
    settle = ShardFetch(job=job, rank=1, epoch=0, want=0, held=(), settle=True)
    waiting = await bus.request(fetch, settle, ShardReply)
    assert waiting.outstanding == 3 and waiting.retry_after_s > 0
    done = tuple(g.ref() for g in reply.grants)
    await bus.request(commit, ShardCommit(job=job, rank=0, step=5, epoch=0, done=done), CommitReply)
    await wait_for(lambda: told, timeout=5, what="the job's end announced")
    assert [(e.epoch, e.incarnation) for e in told] == [(0, 0)]
    final = await bus.request(fetch, settle, ShardReply)
    assert final.status is FetchStatus.JOB_DONE
