"""The node's side of the registry, for torchrun's rendezvous gate: ask the controller
whether this host may join (`node.join`), then heartbeat (`node.heartbeat`) from a loop
thread while torchrun runs. Fail-open: a controller that does not answer within
`join_timeout_s` admits the node (logged), since a control plane away must not stop
training."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid

import structlog
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from antdt.agent.loopthread import LoopThread
from antdt.agent.settings import TOKEN, default_host
from antdt.runtime.bus import Bus, RequestRefused
from antdt.runtime.config import NatsSettings
from antdt.schemas import (
    ErrorCode,
    ErrorReply,
    NodeAdmission,
    NodeHeartbeat,
    NodeJoin,
    NodeState,
    Subjects,
)

log = structlog.get_logger("antdt.agent.nodes")


class GateSettings(BaseSettings):
    """The gate's settings, from the environment torchrun runs in (`ANTDT_<FIELD>`)."""

    model_config = SettingsConfigDict(
        env_prefix="ANTDT_", env_nested_delimiter="__", extra="ignore"
    )

    nats: NatsSettings = Field(default_factory=NatsSettings)
    job: str = Field(min_length=1, max_length=128, pattern=TOKEN.pattern, description="Job id")
    host: str = Field(
        default_factory=default_host,
        min_length=1,
        max_length=128,
        pattern=TOKEN.pattern,
        description="This node's name in the registry; [A-Za-z0-9_-]+",
    )
    join_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="How long a join waits for the controller before admitting anyway "
        "(fail-open), seconds",
    )
    heartbeat_s: float = Field(
        default=3.0, gt=0, description="Seconds between two heartbeats of this node"
    )
    taken_wait_s: float = Field(
        default=20.0,
        ge=0,
        description="How long a join refused as node_taken tries again (the record of a "
        "torchrun that just died on this host lapses meanwhile), seconds",
    )


class NodeGate:
    """One torchrun's registration: `join()` per rendezvous round, heartbeats between."""

    def __init__(self, settings: GateSettings, run_id: str) -> None:
        self.settings = settings
        self.run_id = run_id
        self.subjects = Subjects(settings.nats.subject_prefix)
        self.process = f"{settings.host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"[-128:]
        self.address = _address()
        self.state = NodeState.JOINING
        self.rounds = 0  # join() calls so far
        self._thread = LoopThread(f"antdt-node-{settings.host}").start()
        self._bus: Bus | None = None
        self._beating: asyncio.Future[None] | None = None

    def join(self) -> ErrorReply | None:
        """Ask to join the next round: the refusal (`blocklisted`, `job_ended`, or
        `node_taken` still after `taken_wait_s`), or None: admitted, or no answer
        (fail-open)."""
        self.state = NodeState.JOINING
        timeout = self.settings.join_timeout_s
        waited_until = time.monotonic() + self.settings.taken_wait_s
        try:
            while True:
                try:
                    self._thread.run(self._join(), timeout=timeout + 1)
                    break
                except RequestRefused as refused:
                    code = refused.reply.code
                    if code == ErrorCode.NODE_TAKEN and time.monotonic() < waited_until:
                        time.sleep(min(1.0, self.settings.heartbeat_s))  # its record may lapse
                        continue
                    if code in (ErrorCode.BLOCKLISTED, ErrorCode.NODE_TAKEN, ErrorCode.JOB_ENDED):
                        return refused.reply
                    raise
        except Exception as exc:
            log.warning(
                "controller did not admit the join: admitted without it (fail-open)",
                host=self.settings.host,
                job=self.settings.job,
                error=str(exc)[:200],
            )
        finally:
            self.rounds += 1
        self.state = NodeState.WAITING
        if self._beating is None:
            self._beating = self._thread.submit(self._beat_forever())  # type: ignore[assignment]
        return None

    def job_ended(self, within_s: float) -> bool:
        """Whether the controller says the job ended, asking for up to `within_s` (its
        ranks' last steps may still be on the way when the rendezvous store goes)."""
        deadline = time.monotonic() + within_s
        while True:
            try:
                self._thread.run(self._join(), timeout=self.settings.join_timeout_s + 1)
            except RequestRefused as refused:
                if refused.reply.code == ErrorCode.JOB_ENDED:
                    return True
            except Exception as exc:
                log.info("controller not asked whether the job ended", error=repr(exc))
            if time.monotonic() >= deadline:
                return False
            time.sleep(1.0)

    def close(self) -> None:
        """Stop heartbeating (the record then expires) and the connection."""
        if self._beating is not None:
            self._beating.cancel()
        if self._bus is not None:
            bus, self._bus = self._bus, None
            try:
                self._thread.run(bus.close(), timeout=2)
            except Exception as exc:
                log.debug("node gate connection not closed cleanly", error=repr(exc))
        self._thread.stop()

    async def _connected(self) -> Bus:
        if self._bus is None:
            bus = Bus(self.settings.nats, name=f"antdt-node-{self.settings.host}")
            await bus.connect(retry_for_s=self.settings.join_timeout_s)
            self._bus = bus
        return self._bus

    async def _join(self) -> NodeAdmission:
        bus = await self._connected()
        subject = self.subjects.node_join(self.settings.job)
        return await bus.request(
            subject, self._report(NodeJoin), NodeAdmission, timeout=self.settings.join_timeout_s
        )

    async def _beat_forever(self) -> None:
        subject = self.subjects.node_heartbeat(self.settings.job)
        failing = False
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            try:
                bus = await self._connected()
                beat = self._report(NodeHeartbeat)
                await bus.request(subject, beat, NodeAdmission, timeout=self.settings.heartbeat_s)
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not failing:  # once per outage, not every beat
                    log.warning("node heartbeat failed", host=self.settings.host, error=str(exc))
                failing = True

    def _report(self, kind: type[NodeJoin] | type[NodeHeartbeat]) -> NodeJoin | NodeHeartbeat:
        return kind(
            job=self.settings.job,
            host=self.settings.host,
            process=self.process,
            address=self.address,
            state=self.state,
            run_id=self.run_id[:256],
            restart_round=self.rounds,
        )


def _address() -> str:
    name = socket.gethostname()
    try:
        return f"{name} ({socket.gethostbyname(name)})"[:256]
    except OSError:
        return name[:256]
