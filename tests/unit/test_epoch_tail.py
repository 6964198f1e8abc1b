"""The end of an epoch under an lb-bsp plan: every rank waits at each step for the rank
that still holds data, so what a slow rank holds when the others run dry is a tail of
steps in which the job trains on its small batch alone. Driven through both pure cores,
the agent's stream state and the ledger, with reservations as the service makes them."""

from __future__ import annotations

import math

from antdt.agent.sampling import Taken
from antdt.agent.stream_state import StreamState, open_cursors
from antdt.schemas import JobSpec
from antdt.services.shards.ledger import new_ledger, plan_fetch

DATASET, SHARD, RESERVE = 24_000, 128, 16
#: lb-bsp's plan for a 10x straggler on rank 3 (the demo's job: 1024 samples per step).
PLAN = (330, 330, 331, 33)


def epoch_steps(batches: tuple[int, ...], *, say_share: bool, epochs: int = 2) -> list[int]:
    """Steps per epoch; a fetch is answered before the next step (it takes milliseconds,
    a step a hundred or more)."""
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

    steps = []
    for epoch in range(epochs):
        count = 0
        while True:
            taken = []
            for rank, batch in zip(ranks, batches, strict=True):
                fetch(rank)
                into = Taken()
                while not rank.take(batch, epoch, into):
                    fetch(rank)
                taken.append(into)
            if not any(t.ids for t in taken):
                break
            count += 1
            for rank, into in zip(ranks, taken, strict=True):
                rank.synced(into.finished)
        for rank in ranks:
            rank.advance(epoch)
        steps.append(count)
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
