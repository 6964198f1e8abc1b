"""Bus.gather (scatter-gather over one broadcast subject) against a real nats-server."""

from __future__ import annotations

import time

import pytest

from antdt.runtime.bus import Bus, Delivery, Rejected
from antdt.schemas import Ack, ErrorCode, ErrorReply, PlanRequest

pytestmark = pytest.mark.integration


async def responders(bus: Bus, subject: str, ranks: range) -> None:
    for rank in ranks:

        async def answer(req: PlanRequest, _: Delivery, rank: int = rank) -> Ack:
            if rank == 2:
                raise Rejected(ErrorCode.BAD_REQUEST, "rank 2 says no")
            return Ack(action_id="a1", job=req.job, rank=rank, ok=True, at=time.time())

        await bus.subscribe(subject, PlanRequest, answer)


async def test_gather_collects_every_responder_until_done(bus: Bus) -> None:
    subject = f"{bus.settings.subject_prefix}.gather"
    await responders(bus, subject, range(4))
    await bus.subscribe(subject, PlanRequest, lambda _req, _d: _junk())  # not an Ack

    # done once four answers are in; the junk reply may come before or after them, so a
    # second gather (to the deadline) checks that it is counted, not returned.
    replies = await bus.gather(
        subject, PlanRequest(job="j", rank=0), Ack, timeout=5.0, done=lambda got: len(got) == 4
    )
    assert len(replies) == 4
    before = bus.rejections.counts[("gather", "bad_reply")]
    everything = await bus.gather(subject, PlanRequest(job="j", rank=0), Ack, timeout=2.0)
    assert len(everything) == 4
    acks = sorted(r.rank for r in replies if isinstance(r, Ack))
    errors = [r for r in replies if isinstance(r, ErrorReply)]
    assert acks == [0, 1, 3] and errors[0].error == "rank 2 says no"
    assert bus.rejections.counts[("gather", "bad_reply")] >= before + 1  # the junk reply


async def test_gather_returns_what_came_by_the_timeout(bus: Bus) -> None:
    subject = f"{bus.settings.subject_prefix}.gather2"
    await responders(bus, subject, range(2))
    started = time.monotonic()
    # Long enough for two local replies though the machine stalls: CI's machines do.
    replies = await bus.gather(subject, PlanRequest(job="j", rank=0), Ack, timeout=1.0)
    assert sorted(r.rank for r in replies if isinstance(r, Ack)) == [0, 1]
    assert 1.0 <= time.monotonic() - started < 3.0
    nobody = await bus.gather(f"{subject}.nobody", PlanRequest(job="j", rank=0), Ack, timeout=0.1)
    assert nobody == []


async def _junk() -> PlanRequest:
    return PlanRequest(job="junk", rank=0)
