"""The shard-pulling sampler's I/O shell: a fetcher task on the agent's loop that keeps
grants ahead of the training thread and reports finished shards, and the blocking
`take` the training thread calls. Decisions live in stream_state.StreamState."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import structlog

from antdt.agent.errors import AgentClosed, AgentError
from antdt.agent.readahead import Lot
from antdt.agent.route import ShardRoute
from antdt.agent.sampling import Taken
from antdt.agent.stream_state import Settled, StreamState, open_cursors
from antdt.runtime.bus import Bus, BusError, Delivery, RequestRefused
from antdt.schemas import EpochFinished, ShardFetch, ShardRef, ShardReply, ShardsReturned

log = structlog.get_logger("antdt.agent.shards")
T = TypeVar("T")
#: Seconds a rank with nothing to ask waits before having its unconfirmed done refs
#: confirmed: it matters only if the replica died before its write, and the next fetch
#: usually does it first.
CONFIRM_AFTER_S = 1.0


class Backoff:
    """Exponential backoff with jitter, so ranks that lost the service together do not
    come back in lockstep."""

    def __init__(self, first: float = 0.05, cap: float = 2.0) -> None:
        self.first, self.cap, self.current = first, cap, first

    def next(self) -> float:
        delay = self.current * random.uniform(0.5, 1.0)
        self.current = min(self.current * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.current = self.first


class ShardStream:
    """Thread-safe front of StreamState: the fetcher runs on `loop`, takes on the caller."""

    def __init__(
        self,
        state: StreamState,
        *,
        bus: Bus,
        route: ShardRoute,
        loop: asyncio.AbstractEventLoop,
        request_timeout_s: float | None = None,
    ) -> None:
        self._state = state
        self._bus = bus
        self.route = route
        self._loop = loop
        self._timeout = request_timeout_s
        self._cond = threading.Condition()
        self._wake = asyncio.Event()
        # EpochFinished or ShardsReturned heard since the last request: a rank waiting to
        # leave the epoch, or for the next one, asks again at once.
        self._news = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.errors: Counter[str] = Counter()
        self.requests = 0
        self.closed = False
        self._confirm = False  # the next request should confirm unconfirmed done refs
        # A wake is on its way to the fetcher, which has not looked at the state since
        # (guarded by _cond): further takes need not send one.
        self._kicked = False

    # -- loop side ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the fetcher; call on the loop. Idempotent."""
        if self._task is None:
            self._task = self._loop.create_task(self._run(), name="antdt-shard-fetcher")

    @property
    def started(self) -> bool:
        return self._task is not None

    def build(self, make: Callable[[StreamState], T]) -> T:
        """Build a request from the state under its lock (commit, release)."""
        with self._cond:
            return make(self._state)

    def set_incarnation(self, incarnation: int) -> None:
        with self._cond:
            self._state.incarnation = incarnation

    async def stop(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()  # a training thread blocked on data must not wait forever
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        backoff = Backoff()
        while True:
            self._wake.clear()  # before looking at the state: a later wake is never lost
            fetch, unconfirmed = self._look()
            if fetch is None:
                await self._idle(unconfirmed)
                continue
            try:
                if not self._bus.connected:
                    # nats-py would buffer the request and deliver it after a reconnect,
                    # long after we gave up on its reply: grants in that reply would be lost.
                    raise BusError("not connected to NATS")
                self.requests += 1
                self._news.clear()  # news from here on count: none is lost
                reply = await self._bus.request(
                    self.route.subject, fetch, ShardReply, timeout=self._timeout
                )
                self.route.on_reply(reply.route, time.monotonic())
                cursors = open_cursors(reply.grants, self._state.seed)  # shuffles: no lock held
                with self._cond:
                    delay = self._state.on_reply(fetch, reply, cursors)
                    self._cond.notify_all()
            except Exception as exc:  # the fetcher must outlive any failure
                # BusError (no responder, timeout), RequestRefused (the service may be
                # failing over), or the client's own errors while NATS is away.
                self.route.on_failure(time.monotonic())
                self._failed(exc)
                await asyncio.sleep(backoff.next())
                continue
            backoff.reset()
            if delay:
                await self._pause(delay)

    async def _pause(self, delay: float) -> None:
        """Wait `delay` seconds before asking again, or until the job's epoch finished or
        shards came back."""
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(self._news.wait(), delay)

    async def on_epoch_finished(self, event: EpochFinished, delivery: Delivery) -> None:
        """The service announced the end of an epoch of the job (subscribed by the agent)."""
        self._news.set()

    async def on_shards_returned(self, event: ShardsReturned, delivery: Delivery) -> None:
        """The service announced that a release handed shards of the job back (subscribed
        by the agent): grantable again, so a group waiting to leave the epoch stays."""
        self._news.set()

    def _look(self) -> tuple[ShardFetch | None, bool]:
        """The fetcher looks at the state: the next request, and whether done refs wait
        for confirmation. A wake sent before this is seen: the next one is due again."""
        with self._cond:
            self._kicked = False
            fetch = self._state.next_fetch(confirm=self._confirm, now=time.monotonic())
            unconfirmed = bool(self._state.unconfirmed)
        self._confirm = False
        return fetch, unconfirmed

    async def _idle(self, unconfirmed: bool) -> None:
        """Wait for the training thread; with done refs still unconfirmed, only so long."""
        if not unconfirmed:
            await self._wake.wait()
            return
        try:
            await asyncio.wait_for(self._wake.wait(), CONFIRM_AFTER_S)
        except (TimeoutError, asyncio.TimeoutError):
            self._confirm = True

    def _failed(self, exc: Exception) -> None:
        with self._cond:
            if isinstance(exc, RequestRefused):
                self._state.on_refused(exc.reply.code, exc.reply.error)
            else:
                self._state.on_failure()
            self._cond.notify_all()  # a fatal refusal must reach a waiting training thread
        code = exc.reply.code if isinstance(exc, RequestRefused) else type(exc).__name__
        self.errors[code] += 1
        if self.errors[code] == 1 or self.errors[code] % 100 == 0:
            log.warning(
                "shard fetch failed, retrying", code=code, error=str(exc), count=self.errors[code]
            )

    async def flush(self, timeout: float) -> bool:
        """Wait (bounded) until every synced done ref has been reported."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._cond:
                if self._state.unreported() == 0 or self._state.job_done:
                    return True
            self._confirm = True
            self._wake.set()
            await asyncio.sleep(0.01)
        return False

    # -- training-thread side --------------------------------------------------------

    def _kick(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: closing
            self._loop.call_soon_threadsafe(self._wake.set)

    def take(self, n: int, epoch: int) -> Taken:
        """Block until n sample ids are available in `epoch`, or this rank has no more
        data in it; returns the ids and the shards they finished."""
        taken = Taken()
        with self._cond:
            while not self._state.take(n, epoch, taken):
                self._wait()
            kick = self._kick_due(self._state.needs_fetch())
        if kick:
            self._kick()
        return taken

    def take_lot(self, n: int, step: int, epoch: int) -> Lot | None:
        """Like `take`, for a DataLoader reading ahead: ids handed back by a rewind come
        first; the lot stays read ahead (not counted by commits) until `reached`. None:
        this rank has no more data in `epoch`."""
        with self._cond:
            segments = self._state.ahead.take_returned(n)
            taken = Taken(segments=segments)
            taken.ids = [i for segment in segments for i in segment.ids]
            if len(taken.ids) < n:
                while not self._state.take(n, epoch, taken):
                    self._wait()
            kick = self._kick_due(self._state.needs_fetch())
            lot = Lot(step, n, segments) if taken.ids else None
            if lot is not None:
                self._state.ahead.add(lot)
        if kick:
            self._kick()
        return lot

    def holds(self, epoch: int) -> bool:
        """Whether the rank holds samples of `epoch` no step took yet (StreamState.holds)."""
        with self._cond:
            return self._state.holds(epoch)

    def next_lot(self) -> Lot | None:
        with self._cond:
            return self._state.ahead.head()

    def deliver_lot(self) -> Lot:
        with self._cond:
            return self._state.ahead.deliver()

    def reached(self, lot: Lot) -> None:
        """The step of `lot` updated the model: its ids count, its finished shards are done."""
        with self._cond:
            self._state.ahead.reached(lot)
        self.synced(lot.finished)

    def rewind_ahead(self) -> None:
        """Hand every id read ahead out again, first (a DataLoader iteration restarts)."""
        with self._cond:
            self._state.ahead.rewind()

    def _kick_due(self, wanted: bool) -> bool:
        """Under _cond: should the training thread wake the fetcher? Not if a wake is on
        its way already: the fetcher reads the state after it, so it sees this change too
        (each wake is a write to the loop's self-pipe)."""
        if not wanted or self._kicked:
            return False
        self._kicked = True
        return True

    def _wait(self) -> None:
        """Wait (holding the condition) for the fetcher to change the state."""
        if self.closed:
            raise AgentClosed("the agent was closed while waiting for data")
        if self._state.fatal is not None:
            raise AgentError(f"the shards service refuses this rank: {self._state.fatal}")
        self._kick()
        self._cond.wait(timeout=1.0)

    def synced(self, refs: list[ShardRef]) -> None:
        if not refs:
            return
        with self._cond:
            self._state.synced(refs)
            kick = self._kick_due(True)
        if kick:
            self._kick()

    def settle(self, epoch: int) -> Settled | None:
        """`epoch` is out of data on every rank of the group: block until the ledger first
        answers whether it is over. REOPENED: it has shards for the group to take up;
        FINISHED: it is over; None: wait, shards of it are still in flight. The group
        agrees, and asks again (`settle_again`) while none is REOPENED and any waits."""
        with self._cond:
            self._state.settle(epoch)
            return self._answer(waits_seen=0)

    def settle_again(self) -> Settled | None:
        """The ledger's next answer to the settle under way (see `settle`)."""
        with self._cond:
            return self._answer(waits_seen=self._state.settle_waits)

    def _answer(self, waits_seen: int) -> Settled | None:
        """Wait (holding the condition) for a final answer, or a "wait" after the first
        `waits_seen` of them."""
        while self._state.settled is None and self._state.settle_waits <= waits_seen:
            self._wait()
        return self._state.settled

    def end_settle(self, reopen: bool) -> None:
        """The group agreed (`reopen`: it takes up the epoch's shards that came back)."""
        with self._cond:
            self._state.end_settle(reopen)
        if reopen:
            self._kick()

    def begin_epoch(self, epoch: int) -> int | None:
        """Block until an epoch >= `epoch` is confirmed by the service; None on JOB_DONE."""
        with self._cond:
            while not self._state.ready(epoch):
                self._wait()
            return None if self._state.job_done else self._state.epoch

    def finish_epoch(self, epoch: int) -> None:
        with self._cond:
            self._state.advance(epoch)
        self._kick()

    @property
    def epoch(self) -> int:
        return self._state.epoch

    @property
    def incarnation(self) -> int:
        """The incarnation of this process in the ledger (0 until a restore names one)."""
        return self._state.incarnation

    @property
    def job_done(self) -> bool:
        return self._state.job_done

    def unreported(self) -> int:
        with self._cond:
            return self._state.unreported()
