"""Stand-in ranks of a job, as the controller sees them: real NATS subscribers on the
command subjects that answer as the agent's contract says, and the job's side of the bus
(hellos, health, incidents). Only the training processes are stood in for: no torch."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Collection

from antdt.runtime.bus import Bus, Delivery, Rejected
from antdt.runtime.config import NatsSettings
from antdt.schemas import (
    COMMAND_ADAPTER,
    Ack,
    AdjustBatch,
    ErrorCode,
    Incident,
    IncidentKind,
    IncidentState,
    JobHealth,
    KillRestart,
    Plan,
    RankHealth,
    RankHello,
    RankState,
    StragglerClass,
    Subjects,
)

Command = AdjustBatch | KillRestart
#: May replace a rank's ack (a wrong one, for bad-input tests): (rank, command, ack) -> ack.
AckHook = Callable[[int, Command, Ack], Ack]


class FakeRanks:
    """`world` ranks of `job` acking commands by the agent's rules: a newer AdjustBatch is
    taken, a known one acked again, an older one refused as stale; a KillRestart is acked
    at its checkpoint step unless `step` passed it. `connection`: one Bus for every rank,
    or the settings for one connection per rank (as real ranks have)."""

    def __init__(
        self,
        connection: Bus | NatsSettings,
        subjects: Subjects,
        job: str,
        world: int,
        *,
        step: int = 0,
        hold: asyncio.Event | None = None,
        hook: AckHook | None = None,
    ) -> None:
        """`step`: where the job is; `hold`, while unset: every command waits."""
        self.connection = connection
        self.subjects = subjects
        self.job = job
        self.world = world
        self.step = step
        self.hold = hold
        self.hook = hook
        self.received: list[tuple[int, Command]] = []
        self.applied: Counter[tuple[int, str]] = Counter()  # (rank, "plan-V" or restart id)
        self.versions: dict[int, int] = {}  # rank -> the newest plan version it holds
        self.restarts: dict[int, dict[str, int]] = {}  # rank -> restart id -> checkpoint step
        self.plans: dict[int, dict[int, Plan]] = defaultdict(dict)  # rank -> version -> plan
        self.arrived: dict[int, dict[int, float]] = defaultdict(dict)  # version -> rank -> t
        self.changed = asyncio.Event()  # set when a rank takes a new plan version
        self._buses: list[Bus] = []  # one per rank, or the shared one

    @property
    def commands(self) -> int:
        """Commands received, every rank together."""
        return len(self.received)

    async def start(self) -> FakeRanks:
        for rank in range(self.world):
            bus = await self._bus_of(rank)
            handler = self._handler(rank)
            await bus.subscribe(self.subjects.command(self.job, rank), COMMAND_ADAPTER, handler)
            await bus.subscribe(self.subjects.command_all(self.job), COMMAND_ADAPTER, handler)
        for bus in self._buses:
            await bus.flush()
        return self

    async def _bus_of(self, rank: int) -> Bus:
        if isinstance(self.connection, Bus):
            if not self._buses:
                self._buses.append(self.connection)
            return self.connection
        bus = await Bus(self.connection, name=f"stand-in-{self.job}-{rank}").connect()
        self._buses.append(bus)
        return bus

    async def close(self) -> None:
        """Close the ranks' own connections (a shared Bus stays its owner's)."""
        if not isinstance(self.connection, Bus):
            for bus in self._buses:
                await bus.close()
        self._buses.clear()

    def everyone_has(self, version: int) -> bool:
        return len(self.arrived.get(version, {})) == self.world

    async def wait_version(self, version: int, timeout: float = 10.0) -> dict[int, float]:
        """Until every rank holds plan `version`; returns when it reached each rank."""
        deadline = time.monotonic() + timeout
        while True:
            self.changed.clear()
            if self.everyone_has(version):
                return self.arrived[version]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"plan version {version} reached only {self.arrived[version]}")
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except (TimeoutError, asyncio.TimeoutError):
                continue

    def kills(self) -> list[KillRestart]:
        return [c for _, c in self.received if isinstance(c, KillRestart)]

    def _handler(self, rank: int) -> Callable[[Command, Delivery], Awaitable[Ack]]:
        async def on_command(cmd: Command, _: Delivery) -> Ack:
            self.received.append((rank, cmd))
            if self.hold is not None:
                await self.hold.wait()
            ack = self._adjust(rank, cmd) if isinstance(cmd, AdjustBatch) else self._kill(rank, cmd)
            return self.hook(rank, cmd, ack) if self.hook else ack

        return on_command

    def _ack(
        self,
        rank: int,
        action_id: str,
        *,
        ok: bool,
        applied_step: int | None = None,
        plan_version: int | None = None,
        error: str | None = None,
    ) -> Ack:
        return Ack(
            action_id=action_id,
            job=self.job,
            rank=rank,
            ok=ok,
            at=time.time(),
            applied_step=applied_step,
            plan_version=plan_version,
            error=error,
        )

    def _adjust(self, rank: int, cmd: AdjustBatch) -> Ack:
        plan, known = cmd.plan, self.versions.get(rank, 0)
        if plan.version < known:
            raise Rejected(ErrorCode.STALE, f"plan version {plan.version} < {known}")
        if plan.version > known:
            self.versions[rank] = plan.version
            self.applied[(rank, f"plan-{plan.version}")] += 1
            self.plans[rank][plan.version] = plan
            self.arrived[plan.version][rank] = time.time()
            self.changed.set()
        step = max(plan.effective_step, self.step + 1)
        return self._ack(rank, cmd.action_id, ok=True, applied_step=step, plan_version=plan.version)

    def _kill(self, rank: int, cmd: KillRestart) -> Ack:
        seen = self.restarts.setdefault(rank, {})
        if cmd.action_id in seen:
            return self._ack(rank, cmd.action_id, ok=True, applied_step=seen[cmd.action_id])
        if cmd.checkpoint_step <= self.step:
            error = f"step {cmd.checkpoint_step} already passed"
            return self._ack(rank, cmd.action_id, ok=False, error=error)
        seen[cmd.action_id] = cmd.checkpoint_step
        self.applied[(rank, cmd.action_id)] += 1
        return self._ack(rank, cmd.action_id, ok=True, applied_step=cmd.checkpoint_step)

    # -- the job's side of the bus ---------------------------------------------------------

    @property
    def bus(self) -> Bus:
        """The connection the job's side publishes on (rank 0's, or the shared one)."""
        if not self._buses:
            raise RuntimeError("the ranks are not started")
        return self._buses[0]

    async def hello(self, hosts: dict[int, str]) -> None:
        for rank, host in hosts.items():
            hello = RankHello(
                job=self.job,
                rank=rank,
                world_size=self.world,
                host=host,
                pid=1000 + rank,
                started_at=time.time(),
            )
            await self.bus.publish(self.subjects.hello(self.job, rank), hello)

    async def health(
        self,
        speeds: tuple[float, ...],
        *,
        step: int,
        plan_version: int,
        at: float | None = None,
        hosts: dict[int, str] | None = None,
    ) -> JobHealth:
        """Publish the job's health at `step` (which the ranks are at from now on)."""
        self.step = step
        at = time.time() if at is None else at
        health = job_health(
            self.job, speeds, step=step, plan_version=plan_version, at=at, hosts=hosts or {}
        )
        await self.bus.publish(self.subjects.health(self.job), health)
        return health

    async def incident(
        self,
        rank: int,
        host: str,
        state: IncidentState,
        cls: StragglerClass = StragglerClass.UNKNOWN,
    ) -> Incident:
        now = time.time()
        incident = Incident(
            id=f"{self.job}-r{rank}-slow-1",
            job=self.job,
            rank=rank,
            host=host,
            kind=IncidentKind.SLOW,
            straggler_class=cls,
            state=state,
            step=self.step,
            opened_at=now,
            updated_at=now,
            ratio=3.0,
            windows=3,
        )
        await self.bus.publish(self.subjects.incident(self.job), incident)
        return incident


def acking_ranks(
    nats: NatsSettings, job: str, world: int, *, hook: AckHook | None = None
) -> FakeRanks:
    """FakeRanks of `job` (not started), each rank on its own connection to `nats`."""
    return FakeRanks(nats, Subjects(nats.subject_prefix), job, world, hook=hook)


def signed_by_another(ranks: Collection[int], world: int) -> AckHook:
    """An AckHook: `ranks` sign their acks with the next rank's number (acks that the
    controller must not count)."""

    def sign(rank: int, _: Command, ack: Ack) -> Ack:
        return ack.model_copy(update={"rank": (rank + 1) % world}) if rank in ranks else ack

    return sign


def job_health(
    job: str,
    speeds: tuple[float, ...],
    *,
    step: int,
    plan_version: int,
    at: float,
    hosts: dict[int, str],
) -> JobHealth:
    """A job's health with ranks at `speeds` (samples/s); the slowest is SLOW if any is
    faster."""
    slowest, fastest = min(speeds), max(speeds)
    ranks = tuple(
        RankHealth(
            rank=r,
            host=hosts.get(r, f"slot{r}"),
            state=RankState.SLOW if s == slowest and s < fastest else RankState.OK,
            last_step=step,
            local_batch=32,
            samples_per_s=s,
            compute_s_per_sample=1 / s,
            ratio=fastest / s,
            data_wait_share=0.0,
            comm_share=0.1,
        )
        for r, s in enumerate(speeds)
    )
    return JobHealth(
        job=job,
        at=at,
        step=step,
        step_s=0.1,
        samples_per_s=sum(speeds),
        balance_efficiency=0.6,
        plan_version=plan_version,
        ranks=ranks,
    )


def drawn_health(job: str, ranks: int, seed: int = 7) -> JobHealth:
    """A health of `ranks` measured ranks, their figures drawn from `seed` (as
    incompressible as a real job's: the monitor's floats carry 17 digits): what a large
    job's health weighs on the wire and costs its receivers."""
    draw = random.Random(seed)
    rows = [
        RankHealth(
            rank=r,
            host=f"node{r // 8}",
            state=RankState.OK,
            last_step=1200,
            local_batch=32,
            samples_per_s=draw.uniform(800, 1200),
            compute_s_per_sample=draw.uniform(8e-4, 1.2e-3),
            ratio=draw.uniform(0.9, 1.3),
            data_wait_share=draw.uniform(0, 0.05),
            comm_share=draw.uniform(0.1, 0.3),
            fixed_s=draw.uniform(0.01, 0.02),
            per_sample_s=draw.uniform(8e-4, 1.2e-3),
        )
        for r in range(ranks)
    ]
    return JobHealth(
        job=job,
        at=1.8e9,
        step=1200,
        step_s=0.07,
        samples_per_s=ranks * 32 / 0.07,
        balance_efficiency=0.93,
        plan_version=3,
        ranks=rows,
    )
