"""A custom policy as its own process (the Python and the JavaScript examples): start it
with the bus settings in its environment, collect the JSON lines it prints, wait until
it says it is ready, stop it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.schemas import (
    Cause,
    Incident,
    IncidentKind,
    IncidentState,
    RankHello,
    StragglerClass,
    Subjects,
)
from tests.helpers import wait_for


@dataclass
class PolicyProcess:
    """A policy process and the JSON lines it printed."""

    proc: asyncio.subprocess.Process
    lines: list[dict[str, Any]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    def events(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("event") == event]

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except (TimeoutError, asyncio.TimeoutError):
                self.proc.kill()
                await self.proc.wait()
        if self.reader is not None:
            await self.reader


async def start_policy_process(
    settings: ServiceSettings, argv: Sequence[str], *, cwd: Path | None = None
) -> PolicyProcess:
    """Run `argv` with the bus settings of `settings`; returns once it printed `ready`."""
    env = dict(os.environ)
    env.update(
        ANTDT_NATS__URL=settings.nats.url, ANTDT_NATS__SUBJECT_PREFIX=settings.nats.subject_prefix
    )
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, cwd=None if cwd is None else str(cwd), stdout=asyncio.subprocess.PIPE
    )
    policy = PolicyProcess(proc)

    async def read() -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            with contextlib.suppress(ValueError):
                policy.lines.append(json.loads(raw))

    policy.reader = asyncio.create_task(read())
    try:
        await wait_for(lambda: policy.events("ready"), timeout=30, what=f"{argv[1]} ready")
    except BaseException:
        await policy.stop()
        raise
    return policy


async def announce_cap(bus: Bus, jobs: Any, job: str, world: int, rank: int, cap: int) -> None:
    """Rank `rank` says hello with a memory cap of `cap` samples; returns once the
    controller's job state (`jobs`, its owned jobs by name) holds it."""
    hello = RankHello(
        job=job,
        rank=rank,
        world_size=world,
        host=f"h{rank}",
        pid=1,
        max_local_batch=cap,
        started_at=time.time(),
    )
    await bus.publish(Subjects(bus.settings.subject_prefix).hello(job, rank), hello)
    await wait_for(
        lambda: job in jobs and jobs[job].memory_caps.get(rank) == cap, what=f"rank {rank} cap"
    )


def incident(job: str, n: int, rank: int, ratio: float, **kw: Any) -> Incident:
    """Incident n of `job`: rank `rank` persistently slow by `ratio` (compute-bound)."""
    fields: dict[str, Any] = dict(
        id=f"{job}-i{n}",
        job=job,
        rank=rank,
        host=f"h{rank}",
        kind=IncidentKind.SLOW,
        straggler_class=StragglerClass.PERSISTENT,
        cause=Cause.COMPUTE,
        state=IncidentState.OPENED,
        step=40,
        opened_at=time.time(),
        updated_at=time.time(),
        ratio=ratio,
        windows=3,
    )
    fields.update(kw)
    return Incident(**fields)
