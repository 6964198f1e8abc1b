"""Exactly once relative to the model, for the pure cores together: the agent's StreamState
against the ledger, through checkpoints, crashes with restores, lost replies, prefetches
between commits, and ranks removed without a rollback. Hypothesis draws the job and the
schedule's seed."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from antdt.agent.sampling import Taken
from antdt.agent.stream_state import StreamState, open_cursors
from antdt.schemas import (
    CommitReply,
    ErrorCode,
    ErrorReply,
    JobSpec,
    ReleaseReply,
    RestoreReply,
    ShardCommit,
    ShardFetch,
    ShardPosition,
    ShardRelease,
    ShardRestore,
)
from antdt.services.shards.checkpoints import (
    Outcome,
    apply_commit,
    apply_release,
    apply_restore,
)
from antdt.services.shards.early import Stored, early_reply
from antdt.services.shards.ledger import LedgerState, apply_fetch, new_ledger, plan_fetch
from antdt.services.shards.state import PendingCheckpoint, RankCommit
from antdt.services.shards.work import Work


@dataclass
class Sim:
    spec: JobSpec
    rng: random.Random
    ledger: LedgerState = field(init=False)
    ranks: dict[int, StreamState] = field(default_factory=dict)
    step: int = 0
    epoch: int = 0
    log: dict[int, tuple[int, list[int]]] = field(default_factory=dict)  # step -> (epoch, ids)
    snapshots: dict[int, LedgerState] = field(default_factory=dict)
    model_checkpoint: int | None = None
    restarts: int = 0
    # Write-behind: shards reserved ahead per rank, and the ledger as stored in etcd
    # (`ledger` is the service's working copy, ahead of it by what was answered early).
    reserve: int = 0
    stored: LedgerState = field(init=False)
    early: int = 0

    def __post_init__(self) -> None:
        self.ledger = self.stored = new_ledger(self.spec)
        self.ranks = {r: self.new_rank(r, 0) for r in range(self.spec.world_size)}

    def new_rank(self, rank: int, incarnation: int) -> StreamState:
        state = StreamState(
            job=self.spec.job,
            rank=rank,
            seed=self.spec.seed,
            prefetch=2,
            shard_size=self.spec.shard_size,
        )
        state.incarnation = incarnation
        return state

    # -- the agent's requests, answered by the pure ledger ----------------------------

    def fetch(self, rank: int, *, may_lose: bool = True) -> None:
        state = self.ranks[rank]
        req = state.next_fetch(confirm=self.rng.randint(0, 3) == 0)
        if req is None:
            return
        result = plan_fetch(self.ledger, req, self.reserve)
        self.ledger, reply = result.state, result.reply
        assert not isinstance(reply, ErrorReply), reply
        assert_index_matches(self.ledger)
        early = early_reply(reply, result.early, Stored(self.stored)) if result.early else None
        if early is None:
            self.stored = self.ledger  # answered once written
        else:
            self.early += 1
            reply = early
        if may_lose and self.rng.randint(0, 9) == 0:
            state.on_failure()  # the reply was lost: the ledger moved, the rank did not
            return
        state.on_reply(req, reply, open_cursors(reply.grants, self.spec.seed))

    def maybe_prefetch(self) -> None:
        for rank in list(self.ranks):
            if self.rng.randint(0, 3) == 0:
                self.fetch(rank)
            self.service_weather()

    def service_weather(self) -> None:
        """The write-behind flushes now and then; a replica dies now and then, losing
        what it answered early but had not written (its successor reads etcd)."""
        roll = self.rng.randint(0, 19)
        if roll < 4:
            self.stored = self.ledger
        elif roll == 4:
            self.ledger = self.stored

    def apply(self, out: Outcome) -> None:
        assert not isinstance(out.reply, ErrorReply), out.reply
        self.ledger = self.stored = out.state  # answered once written
        self.snapshots.update(dict(out.store))
        for step in out.drop:
            del self.snapshots[step]

    # -- training -----------------------------------------------------------------------

    def begin_epochs(self) -> bool:
        """Every rank asks until its epoch is confirmed; False when the job is done."""
        for _ in range(10_000):
            states = list(self.ranks.values())
            if all(s.job_done for s in states):
                return False
            if all(s.ready(self.epoch) for s in states):
                epochs = {s.epoch for s in states}
                assert len(epochs) == 1, epochs
                self.epoch = epochs.pop()
                return True
            for rank in self.ranks:
                self.fetch(rank, may_lose=False)
        raise AssertionError("ranks never agreed on an epoch")

    def run_step(self) -> bool:
        """One lockstep step; False when the epoch is over on every rank."""
        self.maybe_prefetch()
        taken: dict[int, Taken] = {}
        for rank, state in self.ranks.items():
            want = self.rng.randint(1, 9)
            taken[rank] = Taken()
            for _ in range(10_000):
                if state.take(want, self.epoch, taken[rank]):
                    break
                self.fetch(rank)
            else:
                raise AssertionError(f"rank {rank} never got data")
        ids = [i for t in taken.values() for i in t.ids]
        if not ids:
            for state in self.ranks.values():
                state.advance(self.epoch)
            self.epoch += 1
            return False
        self.log[self.step] = (self.epoch, ids)  # the step's update reached the model
        for rank, t in taken.items():
            self.ranks[rank].synced(t.finished)
        self.step += 1
        return True

    # -- faults and checkpoints --------------------------------------------------------

    def checkpoint(self) -> None:
        step = self.step - 1
        order = self.rng.sample(sorted(self.ranks), len(self.ranks))
        reply: CommitReply | None = None
        for rank in order:
            self.maybe_prefetch()  # ranks that committed may prefetch before the others
            out = apply_commit(self.ledger, self.ranks[rank].commit_request(step), keep=2)
            self.apply(out)
            assert isinstance(out.reply, CommitReply)
            reply = out.reply
        assert reply is not None and reply.complete and step in self.snapshots
        self.model_checkpoint = step  # the model is saved once the ledger's snapshot is

    def crash_and_restore(self) -> None:
        """Every process dies; the job restarts from the model's last checkpoint."""
        step = self.model_checkpoint
        self.log = {s: v for s, v in self.log.items() if step is not None and s <= step}
        self.restarts += 1
        old = self.ranks
        replies = []
        for rank in range(self.spec.world_size):  # every new rank sends it; one restores
            req = ShardRestore(job=self.spec.job, rank=rank, token=f"r{self.restarts}", step=step)
            out = apply_restore(
                self.ledger, req, self.snapshots.get(step or 0), new_ledger(self.spec)
            )
            self.apply(out)
            assert isinstance(out.reply, RestoreReply)
            replies.append(out.reply)
        assert [r.restored for r in replies] == [True] + [False] * (len(replies) - 1)
        incarnation = replies[0].incarnation
        for state in old.values():  # a process of the old incarnation is fenced
            stale = ShardFetch(
                job=self.spec.job, rank=state.rank, epoch=state.epoch, incarnation=state.incarnation
            )
            _, refused = apply_fetch(self.ledger, stale)
            assert isinstance(refused, ErrorReply) and refused.code == "incarnation"
        self.ranks = {r: self.new_rank(r, incarnation) for r in range(self.spec.world_size)}
        self.step = 0 if step is None else step + 1
        self.epoch = 0

    def remove_rank(self) -> None:
        """A rank leaves without a rollback: what it trained stays in the model."""
        rank = max(self.ranks)
        out = apply_release(self.ledger, self.ranks[rank].release_request("shrink"))
        self.apply(out)
        assert isinstance(out.reply, ReleaseReply)
        del self.ranks[rank]


JOBS = st.builds(
    JobSpec,
    job=st.just("job"),
    world_size=st.integers(2, 4),
    dataset_size=st.integers(20, 240),
    shard_size=st.integers(3, 9),
    global_batch=st.just(16),
    epochs=st.integers(1, 3),
    seed=st.integers(0, 5),
)


def assert_index_matches(state: LedgerState) -> None:
    """A Work starting from the state sees exactly the state's in-flight entries."""
    work = Work.of(state)
    assert len(work.in_flight) == len(state.in_flight)
    assert [work.in_flight[e.shard] for e in state.in_flight] == list(state.in_flight)
    for rank in range(state.world_size):
        assert work.entries_of(rank) == [e for e in state.in_flight if e.rank == rank]


@settings(max_examples=160, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=JOBS, seed=st.integers(0, 2**32), reserve=st.sampled_from([0, 1, 3, 8]))
def test_every_sample_reaches_the_final_model_once_per_epoch(
    spec: JobSpec, seed: int, reserve: int
) -> None:
    """Also with shards reserved ahead and replies sent before their done marks are
    written, across flushes and replica deaths that lose what was not written."""
    rng = random.Random(seed)  # the schedule: batches, prefetches, lost replies, faults
    sim = Sim(spec, rng, reserve=reserve)
    faults = 0
    while sim.begin_epochs():
        while sim.run_step():
            action = rng.randint(0, 9)
            if action == 0:
                sim.checkpoint()
            elif action == 1 and faults < 3:
                faults += 1
                sim.crash_and_restore()
                break  # the restarted processes begin with agent.epochs()
            elif action == 2 and faults < 3 and len(sim.ranks) > 1:
                faults += 1
                sim.remove_rank()
    per_epoch: dict[int, Counter[int]] = {}
    for epoch, ids in sim.log.values():
        per_epoch.setdefault(epoch, Counter()).update(ids)
    assert sorted(per_epoch) == list(range(spec.epochs))
    for epoch, counts in per_epoch.items():
        assert counts == Counter(range(spec.dataset_size)), f"epoch {epoch}"
    assert sim.ledger.complete


# ----------------------------------------------------------------- table-style cases


def spec(**kw: int) -> JobSpec:
    base = {"job": "job", "world_size": 2, "dataset_size": 40, "shard_size": 10, "global_batch": 8}
    return JobSpec(**{**base, **kw})  # type: ignore[arg-type]


def grant(state: LedgerState, rank: int, want: int = 1) -> tuple[LedgerState, list[int]]:
    state, reply = apply_fetch(state, ShardFetch(job="job", rank=rank, epoch=0, want=want))
    assert not isinstance(reply, ErrorReply)
    return state, [g.shard for g in reply.grants]


def commit(rank: int, step: int, **kw: object) -> ShardCommit:
    fields: dict[str, object] = {"job": "job", "rank": rank, "step": step, "epoch": 0, **kw}
    return ShardCommit.model_validate(fields)


def test_a_checkpoint_completes_only_when_every_rank_committed() -> None:
    state, _ = grant(new_ledger(spec()), 0)
    out = apply_commit(state, commit(0, 5))
    assert isinstance(out.reply, CommitReply)
    assert not out.reply.complete and out.reply.waiting_for == (1,) and not out.store
    again = apply_commit(out.state, commit(0, 5))
    assert again.state == out.state  # a repeated commit changes nothing
    done = apply_commit(out.state, commit(1, 5))
    assert isinstance(done.reply, CommitReply) and done.reply.complete
    assert [s for s, _ in done.store] == [5] and done.state.checkpoints == (5,)


def test_commit_refusals_leave_the_ledger_untouched() -> None:
    state, shards = grant(new_ledger(spec()), 0)
    bad = [
        commit(0, 3, positions=(ShardPosition(epoch=0, shard=shards[0], attempt=0, position=11),)),
        commit(1, 3, positions=(ShardPosition(epoch=0, shard=shards[0], attempt=0, position=1),)),
        commit(0, 3, epoch=1),
        commit(5, 3),
        ShardCommit(job="other", rank=0, step=3, epoch=0),
        ShardCommit(job="job", rank=0, step=3, epoch=0, incarnation=2),
    ]
    for req in bad:
        out = apply_commit(state, req)
        assert isinstance(out.reply, ErrorReply), req
        assert out.state is state and not out.store


def test_prune_keeps_the_last_snapshots() -> None:
    state = new_ledger(spec())
    dropped: list[int] = []
    for step in (1, 2, 3, 4):
        for rank in (0, 1):
            out = apply_commit(state, commit(rank, step), keep=2)
            state = out.state
            dropped += out.drop
    assert state.checkpoints == (3, 4) and dropped == [1, 2]
    stale = apply_commit(state, commit(0, 2))
    assert isinstance(stale.reply, ErrorReply) and stale.reply.code == "stale"


def test_restore_to_an_unknown_checkpoint_is_refused() -> None:
    state = new_ledger(spec())
    out = apply_restore(state, ShardRestore(job="job", rank=0, token="t", step=7), None, state)
    assert isinstance(out.reply, ErrorReply) and out.reply.code == "unknown_checkpoint"
    assert out.state is state


def test_a_restore_without_its_inputs_answers_a_known_token_and_refuses_a_new_one() -> None:
    """The shell passes no snapshot and no start when it expects the token to be known
    (every rank of a restart but the first): NOT_READ tells it to read them after all."""
    state = new_ledger(spec())
    first = apply_restore(state, ShardRestore(job="job", rank=0, token="t", step=None), None, state)
    again = apply_restore(
        first.state, ShardRestore(job="job", rank=1, token="t", step=None), None, None
    )
    assert isinstance(again.reply, RestoreReply) and not again.reply.restored
    assert again.reply.incarnation == 1 and again.state is first.state
    new = apply_restore(
        first.state, ShardRestore(job="job", rank=1, token="u", step=None), None, None
    )
    assert isinstance(new.reply, ErrorReply) and new.reply.code == ErrorCode.NOT_READ
    assert new.state is first.state


def test_release_returns_shards_from_the_reported_position() -> None:
    state, shards = grant(new_ledger(spec()), 1, want=2)
    pos = ShardPosition(epoch=0, shard=shards[0], attempt=0, position=4)
    out = apply_release(state, ShardRelease(job="job", rank=1, positions=(pos,)))
    assert isinstance(out.reply, ReleaseReply) and out.reply.returned == 2
    assert [(r.shard, r.position) for r in out.state.requeued] == [(shards[0], 4), (shards[1], 0)]
    assert out.state.left == (1,)
    _, refused = apply_fetch(out.state, ShardFetch(job="job", rank=1, epoch=0))
    assert isinstance(refused, ErrorReply) and refused.code == "removed"
    last = apply_release(out.state, ShardRelease(job="job", rank=0))
    assert isinstance(last.reply, ErrorReply)  # the last rank cannot leave


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=40, unique=True))
def test_a_pending_checkpoint_knows_its_committed_ranks_whichever_way_it_was_built(
    ranks: list[int],
) -> None:
    """Built commit by commit (the committed-rank mask carried along) or decoded whole
    (the mask built from the commits), it answers the same."""
    pending = PendingCheckpoint(step=5, epoch=0)
    for rank in ranks:
        pending = pending.with_commit(RankCommit(rank=rank))
    decoded = PendingCheckpoint.model_validate_json(pending.model_dump_json())
    for checkpoint in (pending, decoded):
        assert checkpoint.committed() == frozenset(ranks)
        assert checkpoint.committed_count() == len(ranks)
        assert [r for r in range(301) if checkpoint.has_committed(r)] == sorted(ranks)
