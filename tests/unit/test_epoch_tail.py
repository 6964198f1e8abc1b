"""The end of an epoch under an lb-bsp plan: every rank waits at each step for the rank
that still holds data, so what a slow rank holds when the others run dry is a tail of
steps in which the job trains on its small batch alone. Driven through both pure cores,
the agent's stream state and the ledger, with reservations as the service makes them."""

from __future__ import annotations

import math

from antdt.agent.sampling import Taken
from antdt.agent.stream_state import StreamState, open_cursors
from antdt.agent.tail import TailCatchUp
from antdt.schemas import JobSpec
from antdt.services.shards.ledger import new_ledger, plan_fetch

DATASET, SHARD, RESERVE = 24_000, 128, 16
#: lb-bsp's plan for a 10x straggler on rank 3 (the demo's job: 1024 samples per step).
PLAN = (330, 330, 331, 33)
#: lb-bsp's plan in the deploy test (512 a step) for a rank whose fixed costs outweigh the
#: others' steps: one sample a step.
STARVED = (171, 170, 170, 1)


def epoch_steps(
    batches: tuple[int, ...], *, say_share: bool, epochs: int = 2, catch_up: bool = False
) -> list[int]:
    """Steps per epoch; a fetch is answered before the next step (it takes milliseconds,
    a step a hundred or more). With `catch_up` the ranks ask as the step driver does:
    those with data take the share of those that ran out (TailCatchUp). Checked on the
    way: no step over the global batch, every id of an epoch once."""
    spec = JobSpec(
        job="tail",
        world_size=len(batches),
        dataset_size=DATASET,
        shard_size=SHARD,
        global_batch=sum(batches),
        epochs=epochs,
    )
    ledger = new_ledger(spec)
    ranks = [
        StreamState(
            job="tail",
            rank=r,
            seed=spec.seed,
            prefetch=2,
            shard_size=SHARD,
            global_batch=spec.global_batch if say_share else 0,
            batch_hint=b if say_share else 0,
        )
        for r, b in enumerate(batches)
    ]

    def fetch(rank: StreamState) -> None:
        nonlocal ledger
        while (request := rank.next_fetch(confirm=True)) is not None:
            result = plan_fetch(ledger, request, RESERVE)
            ledger = result.state
            rank.on_reply(request, result.reply, open_cursors(result.reply.grants, rank.seed))

    steps, tails = [], [TailCatchUp() for _ in batches]
    for epoch in range(epochs):
        count, seen = 0, []
        while True:
            taken, shares = [], []
            for r, (rank, batch, tail) in enumerate(zip(ranks, batches, tails, strict=True)):
                fetch(rank)
                into, asked = Taken(), tail.ask(batches, r, None) if catch_up else batch
                while not rank.take(asked, epoch, into):
                    fetch(rank)
                taken.append(into)
                shares.append(TailCatchUp.full_share(batch, asked, len(into.ids)))
            for tail in tails:  # the count's sum, the same on every rank
                tail.counted(batches, sum(shares))
            if not any(t.ids for t in taken):
                break
            assert sum(len(t.ids) for t in taken) <= spec.global_batch
            seen += [i for t in taken for i in t.ids]
            count += 1
            for rank, into in zip(ranks, taken, strict=True):
                rank.synced(into.finished)
        for rank in ranks:
            rank.advance(epoch)
        steps.append(count)
        assert sorted(seen) == list(range(DATASET))
    assert ledger.complete
    return steps


def test_a_slow_rank_reserves_by_its_share_so_the_epoch_tail_stays_short() -> None:
    ideal = math.ceil(DATASET / sum(PLAN))  # 24
    shared = epoch_steps(PLAN, say_share=True)
    assert max(shared) <= ideal + 8, shared  # its current shard and one prefetched, at most
    # An agent that does not say its batch is reserved an even share: the straggler holds
    # more than it takes in a whole epoch, and the job waits for it.
    even = epoch_steps(PLAN, say_share=False)
    assert min(even) >= ideal + 15, even


def test_balanced_batches_have_no_tail_either_way() -> None:
    for say_share in (True, False):
        assert max(epoch_steps((256, 256, 256, 256), say_share=say_share)) <= 25


def test_the_ranks_with_data_take_the_share_of_those_that_ran_out() -> None:
    ideal = math.ceil(DATASET / sum(STARVED))  # 47
    alone = epoch_steps(STARVED, say_share=True)
    # Its current shard and the one it prefetched, one sample a step.
    assert min(alone) >= ideal + 100, alone
    caught_up = epoch_steps(STARVED, say_share=True, catch_up=True)
    assert max(caught_up) <= ideal + 3, caught_up
    assert max(epoch_steps(PLAN, say_share=True, catch_up=True)) <= max(
        epoch_steps(PLAN, say_share=True)
    )


def test_tail_catch_up_asks_within_the_plan_and_the_memory_cap() -> None:
    tail = TailCatchUp()
    assert tail.ask(STARVED, 3, None) == 1  # nobody ran out yet
    tail.counted(STARVED, TailCatchUp.full_share(1, 1, 1))  # only rank 3 got all it asked
    assert tail.ratio == 512
    assert (tail.ask(STARVED, 3, None), tail.ask(STARVED, 3, 64)) == (171, 64)
    assert tail.ask((0, 512), 0, None) == 0 and tail.ask(STARVED, 0, 64) == 171
    tail.counted(STARVED, 512)  # everyone full again
    assert tail.ratio == 1.0
    tail.counted(STARVED, 0)  # everyone out: the epoch ends
    assert tail.ratio == 1.0 and TailCatchUp.full_share(5, 5, 3) == 0


def test_ranks_planned_no_samples_drain_what_they_hold_once_the_others_ran_out() -> None:
    """A rank the plan gives 0 may hold samples (prefetched, or taken at its batch before
    the plan): it takes none while a rank with a batch got all it asked for, then its
    part of the global batch within the caps, until it holds none."""
    drained = (171, 170, 171, 0)
    tail = TailCatchUp()
    tail.counted(drained, sum(drained), holders=1, mine=1)  # the others are full
    assert not tail.drains and tail.ask(drained, 3, None) == 0
    tail.counted(drained, 170, holders=1, mine=1)  # two ran out: no drain yet
    assert not tail.drains and tail.ask(drained, 3, None) == 0
    assert tail.ask(drained, 1, None) == 171  # the full one takes their share
    tail.counted(drained, 0, holders=1, mine=1)  # all with a batch ran out
    assert tail.drains and tail.ratio == 1.0
    assert (tail.ask(drained, 3, None), tail.ask(drained, 3, 64)) == (171, 64)
    assert tail.ask(drained, 0, None) == 171  # one that ran out asks its plan's, as before
    tail.counted(drained, 0, holders=1, mine=0)  # another rank drains, not this one
    assert tail.drains and tail.ask(drained, 3, None) == 0
    tail.counted(drained, 0)  # none holds any: the count's zero ends the epoch
    assert not tail.drains and tail.ask(drained, 3, None) == 0
    # Several drain: the global batch split among them, at least one sample each.
    tail.counted((512, 0, 0, 0), 0, holders=3, mine=1)
    assert tail.ask((512, 0, 0, 0), 2, None) == 170
    tail.counted((2, 0, 0, 0), 0, holders=3, mine=1)
    assert tail.ask((2, 0, 0, 0), 1, None) == 1
    tail.reset()
    assert not tail.drains and tail.ask((2, 0, 0, 0), 1, None) == 0
