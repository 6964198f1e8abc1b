"""Registering the job with the controller at start: retried until a deadline."""

from __future__ import annotations

import asyncio
import time

import structlog

from antdt.agent.errors import AgentError
from antdt.agent.shards import Backoff
from antdt.runtime.bus import Bus, RequestRefused
from antdt.schemas import ErrorCode, JobSpec, RegisterReply

log = structlog.get_logger("antdt.agent")


async def register(bus: Bus, subject: str, spec: JobSpec, deadline: float) -> RegisterReply:
    """Request `subject` with the spec until the controller answers or `deadline`
    (time.monotonic) passes. A bad_request refusal is final: retrying cannot fix it."""
    backoff = Backoff(first=0.1, cap=2.0)
    last = "no attempt"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AgentError(f"could not register job {spec.job}: {last}")
        try:
            timeout = min(bus.settings.request_timeout_s, max(remaining, 0.05))
            return await bus.request(subject, spec, RegisterReply, timeout=timeout)
        except RequestRefused as exc:
            if exc.reply.code == ErrorCode.BAD_REQUEST:
                raise AgentError(f"job {spec.job} refused: {exc.reply.error}") from None
            last = str(exc)
        except Exception as exc:  # BusError, or the client's own while NATS is away
            last = f"{type(exc).__name__}: {exc}"
        log.debug("register retry", job=spec.job, error=last)
        await asyncio.sleep(min(backoff.next(), max(0.0, deadline - time.monotonic())))


def spec_differences(mine: JobSpec, stored: JobSpec) -> dict[str, tuple[object, object]]:
    """Fields where the stored spec differs from this rank's: {field: (mine, stored)}."""
    ours, theirs = mine.model_dump(), stored.model_dump()
    return {k: (ours[k], theirs.get(k)) for k in ours if ours[k] != theirs.get(k)}
