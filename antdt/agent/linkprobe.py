"""The rank's link to the control plane: a PING/PONG with nats-server every few seconds,
on the agent's loop (never the training thread). Step events carry the median of the
latest probes (`StepEvent.link_rtt_s`): one slow probe (a busy loop, a GC pause) does not
move it, a link slowed for a few probes does."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections import deque

import structlog

from antdt.runtime.bus import Bus, BusError

log = structlog.get_logger("antdt.agent")

#: Seconds between two probes: a link slowed for a few seconds shows within ~3 probes.
PROBE_INTERVAL_S = 2.0
#: Probes the reported figure is the median of.
PROBES_KEPT = 3


class LinkProbe:
    """Round trips to nats-server over the agent's own connection, the latest kept."""

    def __init__(
        self, bus: Bus, *, interval_s: float = PROBE_INTERVAL_S, kept: int = PROBES_KEPT
    ) -> None:
        if interval_s <= 0 or kept < 1:
            raise ValueError("interval_s must be > 0 and kept >= 1")
        self._bus = bus
        self.interval_s = interval_s
        self._rtts: deque[float] = deque(maxlen=kept)
        self._task: asyncio.Task[None] | None = None
        self.failed = 0  # probes with no answer (bus away, or no PONG within the interval)

    @property
    def rtt_s(self) -> float | None:
        """The median of the latest probes, seconds; None before the first answered."""
        return statistics.median(self._rtts) if self._rtts else None

    def start(self) -> None:
        """Probe from now on (on the running loop), the first at once."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def probe(self) -> float | None:
        """One round trip, kept; None when it got no answer."""
        try:
            rtt = await self._bus.rtt(timeout=max(self.interval_s, 1.0))
        except (BusError, asyncio.TimeoutError) as exc:
            self.failed += 1
            if self.failed == 1:
                log.info("link probe unanswered", error=str(exc))
            return None
        self._rtts.append(rtt)
        return rtt

    async def _run(self) -> None:
        while True:
            await self.probe()
            await asyncio.sleep(self.interval_s)
