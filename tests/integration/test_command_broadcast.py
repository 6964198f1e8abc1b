"""A large job's plan through a real nats-server. The controller's AdjustBatch to a job
of `broadcast_from` ranks or more is one publish on the job's command subject, acked by
every rank to one inbox, then a request to each rank that did not ack: asked one by one,
a 10,000-rank job's plan (~30 kB) was 10,000 requests of it, ~300 MB out of the
controller and 10,000 encodings on its event loop per plan. A plan of the largest job a
JobSpec allows, and its ActionRecord, travel gzipped and are accepted up to
MAX_PLAN_BYTES. Stand-in ranks on one connection."""

from __future__ import annotations

from collections import Counter

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.bus.messages import encode
from antdt.runtime.config import ServiceSettings
from antdt.schemas import (
    MAX_MESSAGE_BYTES,
    Ack,
    ActionRecord,
    ActionResult,
    AdjustBatch,
    JobSpec,
    Plan,
    Subjects,
)
from antdt.services.controller.acks import AckTally
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


async def sent_by_a_controller(
    settings: ServiceSettings, command: AdjustBatch, world: int, broadcast_from: int
) -> tuple[AckTally, dict[str, int]]:
    """`command` sent to `world` ranks by the controller's sender on a connection of its
    own: the tally, and the messages and bytes that connection sent."""
    controller = await Bus(settings.nats, name="controller").connect()
    try:
        subjects = Subjects(settings.nats.subject_prefix)
        sender = CommandSender(
            controller,
            subjects,
            ack_timeout_s=5.0,
            ack_deadline_s=30.0,
            broadcast_from=broadcast_from,
        )
        before = dict(controller.nc.stats)
        tally = await sender.send(command, world)
        return tally, {k: controller.nc.stats[k] - before[k] for k in ("out_msgs", "out_bytes")}
    finally:
        await controller.close()


@pytest.mark.parametrize("broadcast_from", [128, WORLD + 1], ids=["broadcast", "one-by-one"])
async def test_a_large_jobs_plan_is_published_once_and_silent_ranks_asked_after(
    settings: ServiceSettings, bus: Bus, broadcast_from: int
) -> None:
    subjects, job = Subjects(settings.nats.subject_prefix), "big"
    calls: Counter[int] = Counter()
    ranks = await FakeRanks(bus, subjects, job, WORLD, hook=wrong_first(calls)).start()  # type: ignore[arg-type]
    command = adjust(job)
    tally, sent = await sent_by_a_controller(settings, command, WORLD, broadcast_from)
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


@pytest.mark.parametrize("broadcast_from", [1, 128], ids=["broadcast", "requested"])
async def test_a_plan_of_100000_ranks_with_micro_batches_reaches_the_ranks_gzipped(
    settings: ServiceSettings, bus: Bus, broadcast_from: int
) -> None:
    """A plan of the largest job a JobSpec allows, three numbers a rank (antdt-dd's
    micro-batches and accumulation): 0.8 MB of JSON, three times the 256 KiB a command was
    held to. Sent gzipped, accepted up to MAX_PLAN_BYTES: the ranks take it."""
    subjects, job, world = Subjects(settings.nats.subject_prefix), "huge", 100_000
    ranks = await FakeRanks(bus, subjects, job, 2).start()
    plan = Plan(
        job=job,
        version=1,
        local_batch=(96,) * world,
        micro_batch=(32,) * world,
        accumulation=(3,) * world,
        effective_step=5,
        created_at=1.0,
    )
    command = AdjustBatch(action_id="a-huge", job=job, plan=plan)
    assert len(encode(command)) > 3 * MAX_MESSAGE_BYTES
    tally, sent = await sent_by_a_controller(settings, command, 2, broadcast_from)
    sent_bytes = sent["out_bytes"]
    assert tally.acked == [0, 1] and ranks.everyone_has(1)
    assert sent_bytes < len(encode(command)) / 10  # gzipped, whether published or requested
    assert ranks.plans[0][1].micro_batch == (32,) * world


async def test_a_large_jobs_action_record_is_stored_gzipped_and_read_back(
    settings: ServiceSettings, bus: Bus
) -> None:
    """An ActionRecord of 40,000 ranks lists every batch and every acked rank (~0.4 MB):
    published to its stream gzipped, read back whole (within MAX_PLAN_BYTES)."""
    subjects, job, world = Subjects(settings.nats.subject_prefix), "records", 40_000
    stream = f"ACTIONS_{settings.nats.subject_prefix.replace('.', '_')}"
    await bus.jetstream.ensure_stream(stream, [subjects.action(job)])
    record = ActionRecord(
        action_id="records-plan-1",
        job=job,
        kind="adjust_batch",
        policy="lb-bsp",
        reason="r",
        plan_version=1,
        local_batch=tuple(64 + r % 7 for r in range(world)),
        effective_step=9,
        decided_at=1.8e9,
        completed_at=1.8e9 + 1.0,
        result=ActionResult.APPLIED,
        acked_ranks=tuple(range(world)),
    )
    assert len(encode(record)) > MAX_MESSAGE_BYTES
    await bus.jetstream.publish(subjects.action(job), record, msg_id=record.action_id)
    replay = await bus.jetstream.read(stream, subjects.action(job), ActionRecord)
    assert replay.items == [record] and bus.rejections.total() == 0
    info = await bus.nc.jetstream().stream_info(stream)
    assert info.state.bytes < len(encode(record)) / 2  # stored gzipped (0.24 here)
