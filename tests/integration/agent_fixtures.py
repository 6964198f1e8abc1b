"""Shared pieces of the agent integration tests: the real services, ranks as threads of
this process, the documented training loop, sample-log checks, and a passive tap on the
shard protocol between the agents and the real shards service."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from antdt.agent import Agent, AgentSettings
from antdt.runtime.bus import Bus, BusError, RequestRefused, decode_reply
from antdt.runtime.config import NatsSettings, ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.schemas import (
    ErrorReply,
    FetchStatus,
    ShardFetch,
    ShardRef,
    ShardReply,
    ShardStatus,
    ShardStatusRequest,
    Subjects,
)
from antdt.services.runner import settings_class, start_service
from tests.e2e.conftest import RunningServices, start_services

# -- the real services -----------------------------------------------------------------


async def start_only(settings: ServiceSettings, *names: str) -> RunningServices:
    """Start only the named real services, on one runtime of their own."""
    runtime = ServiceRuntime("test-" + "+".join(names))
    by_name = {}
    try:
        for name in names:
            by_name[name] = await start_service(
                name, settings_class(name)(**settings.model_dump()), runtime
            )
    except BaseException:
        await runtime.shutdown()
        raise
    return RunningServices(runtime, by_name)


@asynccontextmanager
async def real_services(settings: ServiceSettings, *names: str) -> AsyncIterator[RunningServices]:
    """All three services (or only `names`), shut down on the way out."""
    running = await (start_only(settings, *names) if names else start_services(settings))
    try:
        yield running
    finally:
        await running.runtime.shutdown()


async def shard_status(bus: Bus, job: str) -> ShardStatus:
    """The ledger's view of `job`, asked of the real shards service like `antdt shards
    status` does."""
    subject = Subjects(bus.settings.subject_prefix).shards(job, "status")
    return await bus.request(subject, ShardStatusRequest(job=job), ShardStatus)


# -- a passive tap on the shard protocol -------------------------------------------------


@dataclass
class Exchange:
    fetch: ShardFetch
    reply: ShardReply | ErrorReply | None  # None: not (yet) answered


class ShardsTap:
    """Records a job's `shards.fetch` requests and the real service's replies as they pass
    through the nats-server; it never answers anything. Requests are matched to replies by
    their reply inbox, so the tap also listens on `_INBOX.>`.

    While attached the fetch subjects have a subscriber, so a request made while no shards
    service runs times out instead of failing fast with "no responders": use the tap only
    where the service stays up."""

    def __init__(self, bus: Bus, job: str) -> None:
        self.bus = bus
        self.job = job
        self._fetches: list[tuple[str, ShardFetch]] = []
        self._replies: dict[str, ShardReply | ErrorReply] = {}
        self.sent_at: dict[str, float] = {}  # reply inbox -> when the tap saw the request
        self.replied_at: dict[str, float] = {}  # reply inbox -> when it saw the reply
        self._subs: list[Subscription] = []

    async def attach(self) -> ShardsTap:
        subject = Subjects(self.bus.settings.subject_prefix).shards(self.job, "fetch")
        for tapped in (subject, f"{subject}.*"):  # the queue group's, and every replica's
            self._subs.append(await self.bus.nc.subscribe(tapped, cb=self._on_fetch))
        self._subs.append(await self.bus.nc.subscribe("_INBOX.>", cb=self._on_reply))  # replies
        await self.bus.flush()
        return self

    async def _on_fetch(self, msg: Msg) -> None:
        if msg.reply:
            self.sent_at[msg.reply] = time.monotonic()
            self._fetches.append((msg.reply, ShardFetch.model_validate_json(msg.data)))

    async def _on_reply(self, msg: Msg) -> None:
        try:
            reply: ShardReply | ErrorReply = decode_reply(
                msg.data, ShardReply, msg.headers, require_type=True
            )
        except RequestRefused as refused:
            reply = refused.reply
        except BusError:
            return  # the reply to some other request
        if not isinstance(reply, ShardReply) or reply.job == self.job:
            self._replies[msg.subject] = reply
            self.replied_at[msg.subject] = time.monotonic()

    @property
    def exchanges(self) -> list[Exchange]:
        return [Exchange(f, self._replies.get(inbox)) for inbox, f in self._fetches]

    @property
    def fetches(self) -> list[ShardFetch]:
        return [f for _, f in self._fetches]

    def answered(self, rank: int | None = None) -> list[tuple[ShardFetch, ShardReply]]:
        """(request, reply) pairs the service answered with a ShardReply, in request order."""
        return [
            (x.fetch, x.reply)
            for x in self.exchanges
            if isinstance(x.reply, ShardReply) and rank in (None, x.fetch.rank)
        ]

    def timed(self, rank: int) -> list[tuple[float, float, ShardFetch, ShardReply]]:
        """(sent, replied, request, reply) of `rank`'s answered requests, monotonic s."""
        return [
            (self.sent_at[inbox], self.replied_at[inbox], fetch, reply)
            for inbox, fetch in self._fetches
            if fetch.rank == rank and isinstance(reply := self._replies.get(inbox), ShardReply)
        ]

    def statuses(self, rank: int | None = None) -> Counter[FetchStatus]:
        return Counter(reply.status for _, reply in self.answered(rank))

    def done_refs(self) -> list[ShardRef]:
        """Shards reported done in answered requests, each once, in reporting order."""
        seen: dict[ShardRef, None] = {}
        for fetch, _ in self.answered():
            seen.update(dict.fromkeys(fetch.done))
        return list(seen)


# -- ranks as threads ----------------------------------------------------------------------


class ThreadCollectives:
    """Ranks as threads of this process: SUMs through a barrier instead of gloo."""

    def __init__(self, world: int) -> None:
        self._values = [0] * world
        self._barrier = threading.Barrier(world, timeout=30)
        self.calls = Counter[str]()

    def rank(self, rank: int) -> Any:
        outer = self

        class _Rank:
            def reduce_gradients(self, model: Any, local_samples: int) -> int:
                return outer._sum(rank, local_samples, "grads")

            def agree_max(self, value: int) -> int:
                return outer._sum(rank, value, "agree", combine=max)

            def all_sum(
                self, values: list[int], around: frozenset[int] = frozenset(), posts: Any = None
            ) -> list[int]:
                """The step's count with its tail slot (work sharing runs on real gloo)."""
                return outer._sum(rank, values, "all_sum", combine=_elementwise)

            def reduce_gradients_and_sum(
                self,
                model: Any,
                local_samples: int,
                values: list[int],
                around: frozenset[int] = frozenset(),
            ) -> list[int]:
                raise NotImplementedError("work sharing runs on real gloo ranks")

        return _Rank()

    def _sum(
        self, rank: int, value: Any, what: str, combine: Callable[[list[Any]], Any] = sum
    ) -> Any:
        self._values[rank] = value
        self._barrier.wait()
        total = combine(self._values)
        if rank == 0:
            self.calls[what] += 1
        self._barrier.wait()  # nobody overwrites a value before everyone has read the sum
        return total


def _elementwise(vectors: list[list[int]]) -> list[int]:
    return [sum(column) for column in zip(*vectors, strict=True)]


class NullCollectives:
    """No exchange with other ranks: each rank counts only itself (a rank training on
    its own, or the agent's own cost without communication)."""

    def reduce_gradients(self, model: Any, local_samples: int) -> int:
        return local_samples

    def agree_max(self, value: int) -> int:
        return value

    def all_sum(
        self, values: list[int], around: frozenset[int] = frozenset(), posts: Any = None
    ) -> list[int]:
        return list(values)

    def reduce_gradients_and_sum(
        self,
        model: Any,
        local_samples: int,
        values: list[int],
        around: frozenset[int] = frozenset(),
    ) -> list[int]:
        return list(values)


def agent_settings(nats: NatsSettings, job: str, rank: int, world: int, **kw: Any) -> AgentSettings:
    values: dict[str, Any] = {
        "dataset_size": 50,
        "shard_size": 4,
        "global_batch": 3 * world,
        "epochs": 1,
        "register_timeout_s": 15.0,
        "host": f"h{rank}",
        "inject": "",
    }
    values.update(kw)
    return AgentSettings(nats=nats, job=job, rank=rank, world_size=world, **values)


def train(agent: Agent, on_step: Callable[[Any], None] | None = None) -> list[tuple[int, int]]:
    """The documented training loop without a model; returns (epoch, step) pairs."""
    seen = []
    for epoch in agent.epochs():
        for step in agent.steps():
            if on_step is not None:
                on_step(step)
            step.sync(object())
            seen.append((epoch, step.index))
    return seen


def read_sample_log(prefix: Path, world: int) -> dict[int, list[dict[str, Any]]]:
    out = {}
    for rank in range(world):
        path = Path(f"{prefix}.rank{rank}.jsonl")
        out[rank] = [json.loads(line) for line in path.read_text().splitlines()]
    return out


def assert_exactly_once(lines: dict[int, list[dict[str, Any]]], size: int, epochs: int) -> None:
    for epoch in range(epochs):
        counts = Counter(
            i for rank in lines.values() for ln in rank if ln["epoch"] == epoch for i in ln["ids"]
        )
        assert sorted(counts) == list(range(size)), f"epoch {epoch}: missing or extra ids"
        assert max(counts.values()) == 1, f"epoch {epoch}: repeated ids"


def start_all(agents: list[Agent]) -> None:
    for agent in agents:
        agent.start()


def close_all(agents: list[Agent]) -> None:
    for agent in agents:
        agent.close()


def run_ranks(
    agents: list[Agent], on_step: list[Callable[[Any], None] | None] | None = None
) -> list[list[tuple[int, int]]]:
    """Train every agent on its own thread; `on_step[i]` is rank i's hook."""
    results: list[list[tuple[int, int]]] = [[] for _ in agents]
    errors: list[BaseException] = []
    hooks = on_step or [None] * len(agents)

    def body(i: int) -> None:
        try:
            results[i] = train(agents[i], hooks[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(agents))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results
