"""A nats-server that goes silent without closing the connection (its host lost, the
network cut): the bus notices by its pings and reconnects, in seconds, not after
nats-py's own 4-6 minutes. The server is real; between it and the client a relay stops
passing bytes on the connections it holds, as a dead host would, and relays new ones."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import NatsSettings
from antdt.runtime.servers import EmbeddedNats
from antdt.schemas import StepEvent
from tests.helpers import wait_for
from tests.integration.test_bus import step_event
from tests.relays import TcpRelay

pytestmark = pytest.mark.integration


@pytest.fixture
async def relayed(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedNats, TcpRelay]]:
    server = EmbeddedNats(tmp_path / "n").start()
    host, _, port = server.url.removeprefix("nats://").rpartition(":")
    relay = TcpRelay((host, int(port)))
    yield server, relay
    await relay.close()
    server.stop()


async def test_a_server_gone_silent_is_left_within_the_pings_and_delivery_resumes(
    relayed: tuple[EmbeddedNats, TcpRelay],
) -> None:
    _, relay = relayed
    settings = NatsSettings(
        url=await relay.start(), ping_interval_s=0.5, max_outstanding_pings=2, reconnect_wait_s=0.05
    )
    bus = await Bus(settings, name="silent").connect()
    got: list[StepEvent] = []

    async def on_step(event: StepEvent, _: Delivery) -> None:
        got.append(event)

    await bus.subscribe("x.step", StepEvent, on_step)
    await bus.publish("x.step", step_event())
    await wait_for(lambda: got, timeout=5, what="delivery before")
    silenced, held = time.monotonic(), relay.accepted
    relay.fall_silent()
    # Two pings unanswered, then a new connection: about 1-1.5 s at these settings.
    await wait_for(lambda: relay.accepted > held, timeout=10, what="a new connection")
    left_after = time.monotonic() - silenced
    await wait_for(lambda: bus.connected, timeout=10, what="reconnected")
    await asyncio.sleep(0.05)  # the client re-sends its subscriptions

    async def delivered_again() -> bool:
        before = len(got)
        await bus.publish("x.step", step_event())
        await asyncio.sleep(0.05)
        return len(got) > before

    await wait_for(delivered_again, timeout=10, what="delivery after")
    await bus.close()
    assert left_after < 5.0, left_after
