"""A test double for the ranks of a job, as seen by the controller: plain NATS subscribers
on the real command subjects that ack as the agent contract says (AdjustBatch: a known
version again is an idempotent ack, an older one is refused as stale; KillRestart, on the
broadcast subject: every rank acks ok at the checkpoint step, or refuses once that step
has passed). The servers are real; only the training processes are stood in for. It also
drives the job's side of the bus: hellos, health and incidents."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from antdt.runtime.bus import Bus, Delivery, Rejected
from antdt.schemas import (
    COMMAND_ADAPTER,
    Ack,
    AdjustBatch,
    Incident,
    IncidentKind,
    IncidentState,
    JobHealth,
    KillRestart,
    RankHealth,
    RankHello,
    RankState,
    StragglerClass,
    Subjects,
)

#: A hook that may replace a rank's ack (a wrong one, for bad-input tests).
AckHook = Callable[[int, AdjustBatch | KillRestart, Ack], Ack]


@dataclass
class FakeRanks:
    bus: Bus
    subjects: Subjects
    job: str
    world: int
    step: int = 0  # where the job is: a KillRestart for a step at or before it is refused
    hold: asyncio.Event | None = None  # set: acks flow; unset: every command waits
    hook: AckHook | None = None
    received: list[tuple[int, AdjustBatch | KillRestart]] = field(default_factory=list)
    applied: Counter[tuple[int, str]] = field(default_factory=Counter)  # (rank, plan/restart)
    versions: dict[int, int] = field(default_factory=dict)
    restarts: dict[int, dict[str, int]] = field(default_factory=dict)

    async def start(self) -> FakeRanks:
        for rank in range(self.world):
            await self.bus.subscribe(self.subjects.command(self.job, rank), COMMAND_ADAPTER,
                                     self._handler(rank))  # fmt: skip
            await self.bus.subscribe(self.subjects.command_all(self.job), COMMAND_ADAPTER,
                                     self._handler(rank))  # fmt: skip
        await self.bus.flush()
        return self

    def _handler(self, rank: int):  # type: ignore[no-untyped-def]
        async def on_command(cmd: AdjustBatch | KillRestart, _: Delivery) -> Ack:
            self.received.append((rank, cmd))
            if self.hold is not None:
                await self.hold.wait()
            ack = self._adjust(rank, cmd) if isinstance(cmd, AdjustBatch) else self._kill(rank, cmd)
            return self.hook(rank, cmd, ack) if self.hook else ack

        return on_command

    def _ack(self, rank: int, action_id: str, **fields: object) -> Ack:
        return Ack(action_id=action_id, job=self.job, rank=rank, at=time.time(),
                   **fields)  # type: ignore[arg-type]  # fmt: skip

    def _adjust(self, rank: int, cmd: AdjustBatch) -> Ack:
        known = self.versions.get(rank, 0)
        if cmd.plan.version < known:
            raise Rejected("stale", f"plan version {cmd.plan.version} < {known}")
        if cmd.plan.version > known:
            self.versions[rank] = cmd.plan.version
            self.applied[(rank, f"plan-{cmd.plan.version}")] += 1
        step = max(cmd.plan.effective_step, self.step + 1)
        return self._ack(rank, cmd.action_id, ok=True, applied_step=step,
                         plan_version=cmd.plan.version)  # fmt: skip

    def _kill(self, rank: int, cmd: KillRestart) -> Ack:
        seen = self.restarts.setdefault(rank, {})
        if cmd.action_id in seen:
            return self._ack(rank, cmd.action_id, ok=True, applied_step=seen[cmd.action_id])
        if cmd.checkpoint_step <= self.step:
            return self._ack(rank, cmd.action_id, ok=False,
                             error=f"step {cmd.checkpoint_step} already passed")  # fmt: skip
        seen[cmd.action_id] = cmd.checkpoint_step
        self.applied[(rank, cmd.action_id)] += 1
        return self._ack(rank, cmd.action_id, ok=True, applied_step=cmd.checkpoint_step)

    def kills(self) -> list[KillRestart]:
        return [c for _, c in self.received if isinstance(c, KillRestart)]

    # -- the job's side of the bus ---------------------------------------------------------

    async def hello(self, hosts: dict[int, str]) -> None:
        for rank, host in hosts.items():
            hello = RankHello(job=self.job, rank=rank, world_size=self.world, host=host,
                              pid=1000 + rank, started_at=time.time())  # fmt: skip
            await self.bus.publish(self.subjects.hello(self.job, rank), hello)

    async def health(
        self, speeds: tuple[float, ...], *, step: int, plan_version: int, at: float | None = None,
        hosts: dict[int, str] | None = None,
    ) -> JobHealth:  # fmt: skip
        self.step = step
        health = job_health(self.job, speeds, step=step, plan_version=plan_version,
                            at=time.time() if at is None else at, hosts=hosts or {})  # fmt: skip
        await self.bus.publish(self.subjects.health(self.job), health)
        return health

    async def incident(self, rank: int, host: str, state: IncidentState,
                       cls: StragglerClass = StragglerClass.UNKNOWN) -> Incident:  # fmt: skip
        now = time.time()
        incident = Incident(
            id=f"{self.job}-r{rank}-slow-1", job=self.job, rank=rank, host=host,
            kind=IncidentKind.SLOW, straggler_class=cls, state=state, step=self.step,
            opened_at=now, updated_at=now, ratio=3.0, windows=3,
        )  # fmt: skip
        await self.bus.publish(self.subjects.incident(self.job), incident)
        return incident


def job_health(
    job: str, speeds: tuple[float, ...], *, step: int, plan_version: int, at: float,
    hosts: dict[int, str],
) -> JobHealth:  # fmt: skip
    slowest = min(speeds)
    ranks = tuple(
        RankHealth(
            rank=r, host=hosts.get(r, f"slot{r}"),
            state=RankState.SLOW if s == slowest and s < max(speeds) else RankState.OK,
            last_step=step, local_batch=32, samples_per_s=s, compute_s_per_sample=1 / s,
            ratio=max(speeds) / s, data_wait_share=0.0, comm_share=0.1,
        )
        for r, s in enumerate(speeds)
    )  # fmt: skip
    return JobHealth(job=job, at=at, step=step, step_s=0.1, samples_per_s=sum(speeds),
                     balance_efficiency=0.6, plan_version=plan_version, ranks=ranks)  # fmt: skip
