"""Bus.jetstream.durable against a real nats-server: a durable pull consumer resumes after the last
acked message when bound again, redelivers what was not acked, skips invalid messages."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from antdt.runtime.bus import Bus, StreamMissing
from antdt.schemas import PlanRequest

pytestmark = pytest.mark.integration


@pytest.fixture
async def stream(bus: Bus, unique: str) -> AsyncIterator[tuple[str, str]]:
    name, subject = f"DURABLE_{unique}", f"{bus.settings.subject_prefix}.durable.events"
    await bus.jetstream.ensure_stream(name, [subject], max_age_s=600)
    yield name, subject
    with contextlib.suppress(Exception):
        await bus.nc.jetstream().delete_stream(name)


async def test_durable_consumer_resumes_after_last_ack(bus: Bus, stream: tuple[str, str]) -> None:
    name, subject = stream
    for rank in range(3):
        await bus.jetstream.publish(subject, PlanRequest(job="j", rank=rank))
    await bus.publish_raw(subject, b'{"job": "j", "rank": -1}')  # stored, invalid
    await bus.jetstream.publish(subject, PlanRequest(job="j", rank=3))
    consumer = await bus.jetstream.durable(name, subject, PlanRequest, durable="policy-a")
    got = await consumer.fetch(10, timeout=2.0)
    assert [r.model.rank for r in got] == [0, 1, 2, 3]
    assert all(r.delivered == 1 for r in got)
    assert bus.rejections.total(f"{name}/policy-a") == 1  # the invalid one: counted, dropped
    await got[0].ack()
    await got[1].ack()
    await got[2].nak()
    await got[3].ack()
    await consumer.close()

    # A new process binding the same durable name: only what was not acked comes back.
    again = await bus.jetstream.durable(name, subject, PlanRequest, durable="policy-a")
    redelivered = await again.fetch(10, timeout=2.0)
    assert [(r.model.rank, r.delivered) for r in redelivered] == [(2, 2)]
    await redelivered[0].ack()
    assert await again.fetch(10, timeout=0.3) == []
    await bus.jetstream.publish(subject, PlanRequest(job="j", rank=4))
    assert [r.model.rank for r in await again.fetch(10, timeout=2.0)] == [4]

    # Another durable name starts from the stream's first message (or only new ones).
    other = await bus.jetstream.durable(name, subject, PlanRequest, durable="policy-b")
    assert len(await other.fetch(10, timeout=2.0)) == 5
    fresh = await bus.jetstream.durable(
        name, subject, PlanRequest, durable="policy-c", deliver_new=True
    )
    assert await fresh.fetch(10, timeout=0.3) == []
    for c in (again, other, fresh):
        await c.close()


async def test_durable_on_a_missing_stream(bus: Bus, unique: str) -> None:
    with pytest.raises(StreamMissing):
        await bus.jetstream.durable(f"NOPE_{unique}", f"x.{unique}", PlanRequest, durable="d")
