"""Stand-in ranks for benchmarks and integration tests of the controller.

Each rank answers `{p}.{job}.cmd.{rank}` on its own NATS connection the way an agent does
for AdjustBatch (a newer version is accepted, the same version is acked again, an older
one is refused as stale; the ack says from which step the plan runs), and notes when each
plan version reached it (`time.time()`), so a caller can wait until every rank holds a
version. No training, no torch: only the command path.

In their own process (`python -m antdt.bench.ranks URL PREFIX JOB WORLD REPORT`, until
stdin closes) they publish `{"version", "first", "last"}` on subject REPORT once every
rank holds a version: what the latency bench measures against."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

from antdt.runtime import loops
from antdt.runtime.bus import Bus, Delivery, Rejected
from antdt.runtime.config import NatsSettings
from antdt.schemas import COMMAND_ADAPTER, Ack, AdjustBatch, ErrorCode, KillRestart, Plan, Subjects

Command = AdjustBatch | KillRestart


class AckingRanks:
    """`world_size` ranks of `job` acking commands. `wrong_rank`: ranks that sign their
    acks with another rank's number (an ack the controller must not count)."""

    def __init__(
        self,
        nats: NatsSettings,
        job: str,
        world_size: int,
        *,
        wrong_rank: frozenset[int] = frozenset(),
        report_subject: str | None = None,
    ) -> None:
        self.nats = nats
        self.job = job
        self.world_size = world_size
        self.wrong_rank = wrong_rank
        self.report_subject = report_subject
        self.subjects = Subjects(nats.subject_prefix)
        self.plans: dict[int, dict[int, Plan]] = defaultdict(dict)  # rank -> version -> plan
        self.arrived: dict[int, dict[int, float]] = defaultdict(dict)  # version -> rank -> t
        self.commands = 0
        self.changed = asyncio.Event()
        self._buses: list[Bus] = []

    async def start(self) -> AckingRanks:
        for rank in range(self.world_size):
            bus = await Bus(self.nats, name=f"stand-in-{self.job}-{rank}").connect()
            self._buses.append(bus)
            subject = self.subjects.command(self.job, rank)
            await bus.subscribe(subject, COMMAND_ADAPTER, self._handler(rank))
        return self

    async def close(self) -> None:
        for bus in self._buses:
            await bus.close()
        self._buses.clear()

    def newest(self, rank: int) -> Plan | None:
        known = self.plans.get(rank)
        return known[max(known)] if known else None

    def everyone_has(self, version: int) -> bool:
        return len(self.arrived.get(version, {})) == self.world_size

    async def wait_version(self, version: int, timeout: float = 10.0) -> dict[int, float]:
        """Until every rank holds plan `version`; returns when it reached each rank."""
        deadline = time.monotonic() + timeout
        while not self.everyone_has(version):
            self.changed.clear()
            if self.everyone_has(version):
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"plan version {version} reached only {self.arrived[version]}")
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except (TimeoutError, asyncio.TimeoutError):
                continue
        return self.arrived[version]

    def _handler(self, rank: int) -> Callable[[Command, Delivery], Awaitable[Ack]]:
        async def on_command(cmd: Command, _: Delivery) -> Ack:
            self.commands += 1
            signed = (rank + 1) % self.world_size if rank in self.wrong_rank else rank
            if isinstance(cmd, KillRestart):
                return self._ack(cmd.action_id, signed, ok=False, error="stand-in rank")
            newest, plan = self.newest(rank), cmd.plan
            if newest is not None and plan.version < newest.version:
                raise Rejected(ErrorCode.STALE, f"plan version {plan.version} < {newest.version}")
            if plan.version not in self.plans[rank]:
                self.plans[rank][plan.version] = plan
                self.arrived[plan.version][rank] = time.time()
                self.changed.set()
                if self.report_subject and self.everyone_has(plan.version):
                    await self._report(rank, plan.version)
            return self._ack(
                cmd.action_id,
                signed,
                ok=True,
                applied_step=plan.effective_step,
                plan_version=plan.version,
            )

        return on_command

    async def _report(self, rank: int, version: int) -> None:
        times = self.arrived[version].values()
        report = {"version": version, "first": min(times), "last": max(times)}
        assert self.report_subject is not None
        await self._buses[rank].publish_raw(self.report_subject, json.dumps(report).encode())

    def _ack(
        self,
        action_id: str,
        rank: int,
        *,
        ok: bool,
        applied_step: int | None = None,
        plan_version: int | None = None,
        error: str | None = None,
    ) -> Ack:
        return Ack(action_id=action_id, job=self.job, rank=rank, ok=ok, at=time.time(),
                   applied_step=applied_step, plan_version=plan_version, error=error)  # fmt: skip


async def _serve(url: str, prefix: str, job: str, world_size: int, report: str) -> None:
    nats = NatsSettings(url=url, subject_prefix=prefix)
    ranks = await AckingRanks(nats, job, world_size, report_subject=report).start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until EOF
    await ranks.close()


def main() -> None:
    url, prefix, job, world_size, report = sys.argv[1:6]
    loops.run(_serve(url, prefix, job, int(world_size), report), "auto")


if __name__ == "__main__":
    main()
