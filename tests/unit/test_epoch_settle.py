"""Leaving an epoch: a group whose step counted zero samples asks the ledger whether the
epoch is over (`settle`) and leaves it only once no shard of it is held outside the group.
A rank removed late hands its shards back into an epoch the others were about to leave;
they take them up, wherever the hand-back lands. Driven through both pure cores (the
agent's stream state and the ledger), with reservations as the service makes them; a
rank's "wait" is simply asking again, so a group that can never go on shows as a
request count that runs out."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from pydantic import ValidationError

from antdt.agent.inject import InjectionSchedule
from antdt.agent.sampling import Taken
from antdt.agent.steps import StepDriver
from antdt.agent.stream_state import (
    SETTLE_CODES,
    SETTLE_WAIT,
    Settled,
    StreamState,
    open_cursors,
)
from antdt.schemas import ErrorReply, FetchStatus, JobSpec, ShardFetch, ShardRef
from antdt.services.shards.checkpoints import apply_release
from antdt.services.shards.ledger import LedgerState, new_ledger, plan_fetch

DATASET, SHARD, BATCH, RESERVE, EPOCHS, WORLD = 480, 12, 8, 4, 2, 3
LEAVER, LEAVE_STEP = 2, 6  # the rank removed, after its sync of this step of epoch 0
ASKS = 2_000  # requests a group may make before it counts as stuck


class Stuck(Exception):
    pass


@dataclass
class Group:
    """Three ranks of one job; the last is removed mid-epoch 0 and handed back when
    `release_at` says: "at_leave", or (round, position) of the survivors' settle asks
    (round 0 position 0: before the first; (0, 1): between the two survivors' first asks;
    (1, 0): after both asked once and were told to wait)."""

    release_at: str | tuple[int, int]
    settle: bool = True
    stray_to: int | None = None  # this rank's late fetch takes what the hand-back returns
    strayed: bool = False
    ledger: LedgerState = field(init=False)
    ranks: list[StreamState] = field(init=False)
    trained: dict[int, Counter[int]] = field(default_factory=dict)
    members: list[int] = field(default_factory=lambda: list(range(WORLD)))
    released: bool = False
    reopened: int = 0
    asks: int = 0

    def __post_init__(self) -> None:
        spec = JobSpec(
            job="settle",
            world_size=WORLD,
            dataset_size=DATASET,
            shard_size=SHARD,
            global_batch=WORLD * BATCH,
            epochs=EPOCHS,
        )
        self.ledger = new_ledger(spec)
        shape = {"seed": spec.seed, "prefetch": 2, "shard_size": SHARD}
        self.ranks = [
            StreamState(job="settle", rank=r, global_batch=spec.global_batch, **shape)
            for r in range(WORLD)
        ]

    def ask(self, rank: StreamState) -> None:
        """Send the rank's requests until it has nothing to ask or is told to wait."""
        while (request := rank.next_fetch(confirm=True)) is not None:
            self.asks += 1
            if self.asks > ASKS:
                raise Stuck(f"epoch {rank.epoch}: still asking after {ASKS} requests")
            result = plan_fetch(self.ledger, request, RESERVE)
            assert not isinstance(result.reply, ErrorReply), result.reply
            self.ledger = result.state
            grants = open_cursors(result.reply.grants, rank.seed)
            if rank.on_reply(request, result.reply, grants):
                return

    def release(self) -> None:
        if not self.released:
            request = self.ranks[LEAVER].release_request("elastic shrink")
            outcome = apply_release(self.ledger, request)
            assert not isinstance(outcome.reply, ErrorReply), outcome.reply
            self.ledger, self.released = outcome.state, True
            if self.stray_to is not None and self.ledger.requeued:
                self.stray(self.stray_to)

    def step(self, epoch: int) -> bool:
        """One step of every member; False when it counted zero samples."""
        taken: dict[int, Taken] = {}
        for r in self.members:
            rank, into = self.ranks[r], Taken()
            self.ask(rank)
            while not rank.take(BATCH, epoch, into):
                self.ask(rank)
            taken[r] = into
        if not any(t.ids for t in taken.values()):
            return False
        for r, into in taken.items():
            self.trained.setdefault(epoch, Counter()).update(into.ids)
            self.ranks[r].synced(into.finished)
        return True

    def settled(self, epoch: int) -> bool:
        """The survivors settle as StepDriver does: each round, every one is answered
        (final, or "wait"), then they agree (the MAX of their codes); True when they take
        the epoch up again."""
        ranks = [self.ranks[r] for r in self.members]
        for rank in ranks:
            rank.settle(epoch)
        for round_ in range(ASKS):
            for position, rank in enumerate(ranks):
                if self.release_at == (round_, position):
                    self.release()
                if rank.settled is None:
                    self.ask(rank)
            agreed = max(SETTLE_CODES[rank.settled] for rank in ranks)  # agree_max
            if agreed != SETTLE_WAIT:
                break
        else:
            raise Stuck(f"epoch {epoch}: still settling after {ASKS} rounds")
        reopen = agreed == SETTLE_CODES[Settled.REOPENED]
        for rank in ranks:
            rank.end_settle(reopen)
        self.reopened += reopen
        return reopen

    def stray(self, rank: int) -> None:
        """A fetch of `rank`'s own, from before it ran out of data, applied only now: a
        replica stalled past the rank's timeout, and the rank's retry was answered by
        another. It takes every shard the hand-back made grantable, and its reply goes
        nowhere: nothing is left to grant, and the rank does not know what it holds."""
        late = ShardFetch(job="settle", rank=rank, epoch=0, want=len(self.ledger.requeued), held=())
        result = plan_fetch(self.ledger, late, RESERVE)
        assert not isinstance(result.reply, ErrorReply) and result.reply.grants
        assert not result.state.requeued and result.state.cursor == result.state.num_shards
        self.ledger, self.strayed = result.state, True

    def run(self) -> None:
        step = 0
        for epoch in range(EPOCHS):
            while True:
                while self.step(epoch):
                    step += 1
                    if step == LEAVE_STEP and LEAVER in self.members:
                        self.members.remove(LEAVER)
                        if self.release_at == "at_leave":
                            self.release()
                if not self.settle or not self.settled(epoch):
                    break
            for r in self.members:
                self.ranks[r].advance(epoch)
            if epoch == 0:
                self.release()  # a hand-back that never came while the group waited


@pytest.mark.parametrize(
    "release_at",
    ["at_leave", (0, 0), (0, 1), (1, 0), (3, 1)],
    ids=["mid-epoch", "before-the-first-ask", "between-the-asks", "after-both-waited", "later"],
)
def test_a_hand_back_reaches_the_group_wherever_it_lands(release_at: str | tuple[int, int]) -> None:
    group = Group(release_at)
    group.run()
    assert group.ledger.complete
    for epoch in range(EPOCHS):
        assert group.trained[epoch] == Counter(range(DATASET)), f"epoch {epoch}"
    # Handed back after the survivors ran out, its shards took them back into epoch 0.
    assert group.reopened == (0 if release_at == "at_leave" else 1)


@pytest.mark.parametrize("release_at", [(0, 0), (1, 0)], ids=["at-run-out", "while-waiting"])
@pytest.mark.parametrize("stray_to", [0, 1])
def test_shards_a_rank_never_heard_of_are_trained_by_its_group(
    release_at: tuple[int, int], stray_to: int
) -> None:
    """The removed rank's shards are handed back as the survivors settle epoch 0, and a
    late fetch of one of them takes them all: that rank holds shards it never heard of,
    and nothing is left to grant. Its settle hands them to it, the group takes the epoch
    up again and trains them: every sample of every epoch exactly once. Before, every
    rank waited for those shards for good."""
    group = Group(release_at, stray_to=stray_to)
    group.run()
    assert group.strayed and group.ledger.complete
    for epoch in range(EPOCHS):
        assert group.trained[epoch] == Counter(range(DATASET)), f"epoch {epoch}"
    assert group.reopened == 1


def test_leaving_an_epoch_on_the_zero_alone_strands_a_late_hand_back() -> None:
    """The protocol before settling: the survivors ask for epoch 1 while the removed
    rank still holds shards of epoch 0 (PENDING); its hand-back re-queues them in an epoch
    nobody asks for any more, and epoch 1 never starts."""
    group = Group(release_at="never", settle=False)
    with pytest.raises(Stuck, match="epoch 1"):
        group.run()
    assert group.ledger.epoch == 0 and group.ledger.requeued


# -------------------------------------------------------------- the ledger's answer


def _ledger_with_grants() -> LedgerState:
    spec = JobSpec(job="s", world_size=2, dataset_size=40, shard_size=10, global_batch=4)
    ledger = new_ledger(spec)
    for rank in (0, 1):  # each holds one shard, told of it
        result = plan_fetch(ledger, ShardFetch(job="s", rank=rank, epoch=0, want=1, held=()))
        ledger = result.state
    return ledger


def _settle(ledger: LedgerState, rank: int, **kw: object) -> tuple[LedgerState, object]:
    result = plan_fetch(ledger, ShardFetch(job="s", rank=rank, epoch=0, want=0, settle=True, **kw))
    return result.state, result.reply


def test_a_settle_counts_the_shards_held_elsewhere_and_grants_nothing() -> None:
    ledger = _ledger_with_grants()
    mine = [
        ShardRef(epoch=0, shard=e.shard, attempt=e.attempt) for e in ledger.in_flight if e.rank == 0
    ]
    after, reply = _settle(ledger, 0, done=tuple(mine), held=())
    assert reply.status is FetchStatus.OK and reply.outstanding == 1 and not reply.grants
    assert reply.retry_after_s > 0  # rank 1's shard: ask again later
    assert after.cursor == ledger.cursor  # nothing granted, nothing reserved


def test_a_request_that_wants_nothing_reserves_nothing() -> None:
    """A done report may come after its rank ran out of data, and after a hand-back
    made shards grantable again: a shard reserved for that rank then, never told of,
    would keep the whole group waiting at the epoch's end."""
    spec = JobSpec(job="s", world_size=2, dataset_size=400, shard_size=10, global_batch=4)
    ledger = plan_fetch(new_ledger(spec), ShardFetch(job="s", rank=1, epoch=0, held=())).state
    [held] = [ShardRef(epoch=0, shard=e.shard, attempt=0) for e in ledger.in_flight]
    report = ShardFetch(job="s", rank=1, epoch=0, want=0, held=(held,))
    assert plan_fetch(ledger, report, 4).state.cursor == ledger.cursor
    asking = ShardFetch(job="s", rank=1, epoch=0, want=1, held=(held,))
    assert plan_fetch(ledger, asking, 4).state.cursor == ledger.cursor + 1 + 4  # 4 reserved
    # A settle counts every shard in flight, the asking rank's own too (until reported).
    _, reply = _settle(_ledger_with_grants(), 0, held=())
    assert reply.outstanding == 2 and reply.status is FetchStatus.OK


def test_a_finished_epoch_settles_and_the_next_one_is_its_ledgers_answer() -> None:
    spec = JobSpec(job="s", world_size=1, dataset_size=10, shard_size=10, global_batch=2, epochs=2)
    ledger = plan_fetch(new_ledger(spec), ShardFetch(job="s", rank=0, epoch=0, want=1)).state
    done = (ShardRef(epoch=0, shard=0, attempt=0),)
    _, reply = _settle(ledger, 0, done=done, held=())
    assert reply.status is FetchStatus.EPOCH_DONE and reply.outstanding == 0


def test_bad_settle_requests_are_refused_and_change_nothing() -> None:
    with pytest.raises(ValidationError, match="wants nothing"):
        ShardFetch(job="s", rank=0, epoch=0, want=1, settle=True)
    ledger = _ledger_with_grants()
    result = plan_fetch(ledger, ShardFetch(job="s", rank=0, epoch=1, want=0, settle=True))
    assert isinstance(result.reply, ErrorReply) and result.reply.code == "stale"
    assert result.state is ledger


# ------------------------------------------------------ the group's rounds (StepDriver)


class ScriptedStream:
    """A rank's shard stream as StepDriver settles it: the ledger's answers, in turn."""

    def __init__(self, *answers: Settled | None) -> None:
        self.answers = list(answers)
        self.asked = 0
        self.reopened: bool | None = None

    def settle(self, epoch: int) -> Settled | None:
        return self.settle_again()

    def settle_again(self) -> Settled | None:
        self.asked += 1
        return self.answers.pop(0)

    def end_settle(self, reopen: bool) -> None:
        self.reopened = reopen


class ScriptedGroup:
    """agree_max against the other ranks' codes, one per round."""

    def __init__(self, *others: int) -> None:
        self.others = list(others)

    def agree_max(self, value: int) -> int:
        return max(value, self.others.pop(0))


WAIT = SETTLE_WAIT
FINISHED, REOPENED = SETTLE_CODES[Settled.FINISHED], SETTLE_CODES[Settled.REOPENED]


def _driver(stream: ScriptedStream, group: ScriptedGroup) -> StepDriver:
    """Rank 0's step driver on a scripted stream and group (no plans needed)."""
    return StepDriver(
        rank=0,
        host="h",
        stream=cast(Any, stream),
        plans=cast(Any, None),
        collectives=lambda: cast(Any, group),
        schedule=InjectionSchedule(),
        emit=lambda record: None,
    )


@pytest.mark.parametrize(
    ("mine", "others", "asked", "reopen"),
    [
        ((None, None, Settled.FINISHED), (FINISHED, WAIT, FINISHED), 3, False),
        ((Settled.REOPENED,), (WAIT,), 1, True),
        ((Settled.FINISHED, Settled.FINISHED), (WAIT, REOPENED), 2, True),
        ((None, Settled.REOPENED), (WAIT, WAIT), 2, True),
    ],
    ids=[
        "asks-while-any-waits",
        "handed-shards-while-others-wait",
        "another-is-handed-shards",
        "handed-shards-later",
    ],
)
def test_a_group_settles_in_rounds_until_none_waits_or_any_goes_on(
    mine: tuple[Settled | None, ...], others: tuple[int, ...], asked: int, reopen: bool
) -> None:
    """Each round every rank is answered and the group agrees: any REOPENED takes all
    back into the epoch at once, though others were told to wait (the shards it was
    handed are what they wait for); else they ask again while any waits."""
    stream, group = ScriptedStream(*mine), ScriptedGroup(*others)
    driver = _driver(stream, group)
    assert driver._taken_up_again(0) is reopen
    assert (stream.asked, stream.reopened, group.others) == (asked, reopen, [])


def test_a_zero_count_while_a_rank_planned_no_samples_drains_goes_on_unsettled() -> None:
    """A rank the plan gives 0 still holds samples: the group goes on in the epoch (it
    takes them next) without asking the ledger, which counts them in flight and would
    tell every rank to wait for them for good."""
    stream, group = ScriptedStream(), ScriptedGroup()
    driver = _driver(stream, group)
    driver._tail.counted((8, 0), 0, holders=1)
    assert driver.goes_on(0) and stream.asked == 0
    driver._tail.counted((8, 0), 0)
    stream.answers, group.others = [Settled.FINISHED], [FINISHED]
    assert not driver.goes_on(0) and stream.asked == 1
