"""TCP relays that stand between a real client and a real server in tests, shaping what
passes as a link would (delay, a host gone silent): faults injected, nothing answered."""

from __future__ import annotations

import asyncio
import contextlib


class TcpRelay:
    """Relays TCP connections to `target`, one `_pump` task per direction (subclasses
    shape what passes). `fall_silent()` freezes every connection held (bytes neither
    passed nor refused, sockets left open), as a host lost or a network cut would; later
    ones relay. `accepted` counts connections (a client's probe included)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._held: list[asyncio.Event] = []  # each connection's freeze, until it is set

    def fall_silent(self) -> None:
        for frozen in self._held:
            frozen.set()
        self._held = []

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"nats://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        frozen = asyncio.Event()
        self._held.append(frozen)
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(source, sink, frozen))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, frozen: asyncio.Event
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


class DelayingRelay(TcpRelay):
    """Each chunk held `delay_s` in each direction (in order: a chunk leaves `delay_s`
    after it arrived, never before the one before); never frozen."""

    def __init__(self, target: tuple[str, int], delay_s: float) -> None:
        super().__init__(target)
        self.delay_s = delay_s

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, frozen: asyncio.Event
    ) -> None:
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def forward() -> None:
            while True:
                due, chunk = await held.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                sink.write(chunk)
                await sink.drain()

        forwarding = asyncio.create_task(forward())
        try:
            while chunk := await source.read(65536):
                held.put_nowait((loop.time() + self.delay_s, chunk))
            while not held.empty():
                await asyncio.sleep(self.delay_s)
        finally:
            forwarding.cancel()
            with contextlib.suppress(Exception):
                sink.close()
