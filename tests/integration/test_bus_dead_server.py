"""A nats-server that goes silent without closing the connection (its host lost, the
network cut): the bus notices by its pings and reconnects, in seconds, not after
nats-py's own 4-6 minutes. The server is real; between it and the client a relay stops
passing bytes on the connections it holds, as a dead host would, and relays new ones."""

from __future__ import annotations

import asyncio
import contextlib
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

pytestmark = pytest.mark.integration


class FallingSilentRelay:
    """Relays TCP connections to `target`; `fall_silent()` freezes every connection held
    (bytes neither passed nor refused, sockets left open). Later connections relay."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._frozen: list[asyncio.Event] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"nats://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def fall_silent(self) -> None:
        for frozen in self._frozen:
            frozen.set()
        self._frozen = []

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        frozen = asyncio.Event()
        self._frozen.append(frozen)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(source, sink, frozen))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _pump(
        source: asyncio.StreamReader, sink: asyncio.StreamWriter, frozen: asyncio.Event
    ) -> None:
        try:
            while chunk := await source.read(65536):
                if frozen.is_set():
                    await asyncio.Event().wait()  # held open, silent, until cancelled
                sink.write(chunk)
                await sink.drain()
        finally:
            with contextlib.suppress(Exception):
                sink.close()


@pytest.fixture
async def relayed(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedNats, FallingSilentRelay]]:
    server = EmbeddedNats(tmp_path / "n").start()
    host, _, port = server.url.removeprefix("nats://").rpartition(":")
    relay = FallingSilentRelay((host, int(port)))
    yield server, relay
    await relay.close()
    server.stop()


async def test_a_server_gone_silent_is_left_within_the_pings_and_delivery_resumes(
    relayed: tuple[EmbeddedNats, FallingSilentRelay],
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
