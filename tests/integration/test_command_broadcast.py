"""A plan for a large job goes out once: the controller's AdjustBatch to a job of
`broadcast_from` ranks or more is one publish on the job's command subject, acked by
every rank to one inbox, then a request to each rank that did not ack. Asked one by one,
a 10,000-rank job's plan (~30 kB) was 10,000 requests of it: ~300 MB through the server
and 10,000 encodings on the controller's event loop per plan. Real nats-server, stand-in
ranks on one connection."""

from __future__ import annotations

from collections import Counter

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.bus.messages import encode
from antdt.runtime.config import ServiceSettings
from antdt.schemas import Ack, AdjustBatch, JobSpec, Subjects
from antdt.services.controller.plans import initial_plan
from antdt.services.controller.sender import CommandSender
from antdt.testing import FakeRanks

pytestmark = pytest.mark.integration
WORLD = 1_000
#: Ranks whose first answer is not an ack (another action's): asked again on their own.
FIRST_WRONG = {7, 500}


def adjust(job: str) -> AdjustBatch:
    spec = JobSpec(
        job=job, world_size=WORLD, dataset_size=64_000, shard_size=64, global_batch=64_000
    )
    plan = initial_plan(spec, now=0.0).model_copy(update={"version": 1, "effective_step": 5})
    return AdjustBatch(action_id="a-1", job=job, plan=plan)


def wrong_first(calls: Counter[int]) -> object:
    def hook(rank: int, _: object, ack: Ack) -> Ack:
        calls[rank] += 1
        if rank in FIRST_WRONG and calls[rank] == 1:
            return ack.model_copy(update={"action_id": "another"})
        return ack

    return hook


@pytest.mark.parametrize("broadcast_from", [128, WORLD + 1], ids=["broadcast", "one-by-one"])
async def test_a_large_jobs_plan_is_published_once_and_silent_ranks_asked_after(
    settings: ServiceSettings, bus: Bus, broadcast_from: int
) -> None:
    subjects, job = Subjects(settings.nats.subject_prefix), "big"
    calls: Counter[int] = Counter()
    ranks = await FakeRanks(bus, subjects, job, WORLD, hook=wrong_first(calls)).start()  # type: ignore[arg-type]
    controller = await Bus(settings.nats, name="controller").connect()
    try:
        sender = CommandSender(
            controller,
            subjects,
            ack_timeout_s=5.0,
            ack_deadline_s=30.0,
            broadcast_from=broadcast_from,
        )
        command = adjust(job)
        before = dict(controller.nc.stats)
        tally = await sender.send(command, WORLD)
        sent = {k: controller.nc.stats[k] - before[k] for k in ("out_msgs", "out_bytes")}
    finally:
        await controller.close()
    assert tally.complete and tally.acked == list(range(WORLD))
    assert ranks.everyone_has(1)
    assert {r for r, n in calls.items() if n > 1} == FIRST_WRONG  # asked again, on their own
    size = len(encode(command))
    if broadcast_from <= WORLD:  # one publish, and a request to each rank not acked
        assert sent["out_msgs"] == 1 + len(FIRST_WRONG)
        assert sent["out_bytes"] < (2 + len(FIRST_WRONG)) * size
    else:
        assert sent["out_msgs"] == WORLD + len(FIRST_WRONG)
        assert sent["out_bytes"] > WORLD * size
