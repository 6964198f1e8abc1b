"""Real torch ranks (gloo, started by antdt.agent.launch) training with the agent against
the real services (policy "none", so the only plan change is the one the test commands):
every sample once per epoch, replicas identical, a commanded plan switch applied at its
step, the injected straggler visible in the step events, and the job's end seen as an
end (every rank finished, its incidents resolved, no stall)."""

from __future__ import annotations

import asyncio
import statistics
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from antdt.agent import launch
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import ServiceSettings
from antdt.runtime.coordination.jobs import live_jobs
from antdt.schemas import (
    Ack,
    AdjustBatch,
    ExitReason,
    Incident,
    IncidentKind,
    IncidentState,
    JobHealth,
    Plan,
    RankExit,
    RankState,
    StepEvent,
    Subjects,
)
from tests.e2e.conftest import RunningServices
from tests.helpers import wait_for
from tests.integration.agent_fixtures import assert_exactly_once, read_sample_log, real_services

pytest.importorskip("torch")
pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = textwrap.dedent(
    """
    import os, sys, torch
    import antdt.agent

    torch.set_num_threads(1)
    agent = antdt.agent.init()
    antdt.agent.init_process_group(timeout_s=60)
    torch.manual_seed(0)
    size = agent.spec.dataset_size
    x = torch.linspace(-1, 1, size * 4, dtype=torch.float64).reshape(size, 4)
    y = x.sum(dim=1, keepdim=True) * 0.5
    model = torch.nn.Linear(4, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in agent.epochs():
        for step in agent.steps():
            ids = step.sample_ids
            if ids:
                for _ in range(20):  # some compute for the injected slowdown to scale
                    torch.mm(torch.ones(64, 64), torch.ones(64, 64))
                ((model(x[ids]) - y[ids]) ** 2).mean().backward()
            step.sync(model)
            opt.step()
            opt.zero_grad()
    params = [p.detach().flatten().tolist() for p in model.parameters()]
    with open(sys.argv[1] + f".rank{agent.settings.rank}.params", "w") as f:
        f.write(repr(params))
    agent.close()
    antdt.agent.destroy_process_group()
    """
)


@pytest.fixture
async def services(settings: ServiceSettings) -> AsyncIterator[RunningServices]:
    async with real_services(settings) as running:
        yield running


async def test_two_torch_ranks_train_with_the_agent(
    services: RunningServices, settings: ServiceSettings, unique: str, bus: Bus, tmp_path: Path
) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    events: list[StepEvent] = []
    exits: list[RankExit] = []
    healths: list[JobHealth] = []
    incidents: list[Incident] = []

    async def on_step(event: StepEvent, _: Delivery) -> None:
        events.append(event)

    def collect(into: list[Any]) -> Callable[[Any, Delivery], Awaitable[None]]:
        async def append(message: Any, _: Delivery) -> None:
            into.append(message)

        return append

    await bus.subscribe(subjects.step(unique, "*"), StepEvent, on_step)
    await bus.subscribe(subjects.exit(unique, "*"), RankExit, collect(exits))
    await bus.subscribe(subjects.health(unique), JobHealth, collect(healths))
    await bus.subscribe(subjects.incident(unique), Incident, collect(incidents))
    await bus.flush()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run"
    env = {
        "ANTDT_NATS__URL": settings.nats.url,
        "ANTDT_NATS__SUBJECT_PREFIX": settings.nats.subject_prefix,
        "ANTDT_JOB": unique,
        "ANTDT_DATASET_SIZE": "240",
        "ANTDT_SHARD_SIZE": "10",
        "ANTDT_GLOBAL_BATCH": "8",
        "ANTDT_EPOCHS": "2",
        "ANTDT_SAMPLE_LOG": str(out),
        "ANTDT_INJECT": "host=slot1,factor=6,from=2",
        "ANTDT_TELEMETRY__LOG_LEVEL": "warning",
    }
    run = asyncio.ensure_future(
        asyncio.to_thread(launch, 2, [sys.executable, str(script), str(out)], env=env)
    )
    await wait_for(lambda: events or run.done(), timeout=60, what="first step event")
    new = Plan(job=unique, version=1, local_batch=(6, 2), effective_step=12, created_at=time.time())
    acks = [
        await bus.request(
            subjects.command(unique, r), AdjustBatch(action_id="a1", job=unique, plan=new), Ack
        )
        for r in range(2)
    ]
    assert await asyncio.wait_for(run, 120) == 0

    assert_exactly_once(read_sample_log(out, 2), 240, epochs=2)
    params = [Path(f"{out}.rank{r}.params").read_text() for r in range(2)]
    assert params[0] == params[1]  # same updates on every replica
    assert all(a.ok for a in acks)
    switch = max(a.applied_step or 0 for a in acks)
    await wait_for(
        lambda: len({(e.rank, e.step) for e in events}) == 2 * _steps(events),
        what="all step events",
    )
    for e in events:  # each rank switches at the step its ack announced
        applied = acks[e.rank].applied_step
        assert applied is not None
        assert e.local_batch == ((6, 2)[e.rank] if e.step >= applied else 4), e
    compute = {
        r: statistics.median(
            e.compute_s for e in events if e.rank == r and e.step >= 2 and e.samples
        )
        for r in range(2)
    }
    assert compute[1] > 2 * compute[0], compute  # the injected straggler on host slot1
    print(f"\nsteps={_steps(events)} switch_at={switch} median compute_s={compute}")
    await _assert_the_job_ended(services, unique, exits, healths, incidents, _steps(events))


async def _assert_the_job_ended(
    services: RunningServices,
    job: str,
    exits: list[RankExit],
    healths: list[JobHealth],
    incidents: list[Incident],
    steps: int,
) -> None:
    """Both ranks said they finished after their last step; the monitor published a last
    health with both exited, resolved what it had open and forgot the job (so it can
    never call the finished ranks stalled); the controller dropped its state too. The
    job's end is stored (`ended`, its last health), no service owns it any more, and
    their claim rounds leave it alone."""
    monitor, controller = services.by_name["monitor"], services.by_name["controller"]
    await wait_for(lambda: job not in monitor.detectors, what="the monitor forgets the job")
    await wait_for(lambda: job not in controller.jobs, what="the controller drops the job")
    store, keys = monitor.store, monitor.keys
    stored = await wait_for(lambda: store.get(keys.ended(job)), what="the job's end stored")
    last = JobHealth.model_validate_json(stored.value)
    assert [r.state for r in last.ranks] == [RankState.EXITED] * 2 and last.step == steps - 1
    for service in ("monitor", "controller"):
        owner = keys.owner(service, job)
        await wait_for(lambda o=owner: _absent(store, o), what=f"the {service} gives it up")
    assert job not in await live_jobs(store, keys) and job not in await controller._claimable()
    assert sorted((x.rank, x.reason, x.step) for x in exits) == [
        (0, ExitReason.FINISHED, steps - 1),
        (1, ExitReason.FINISHED, steps - 1),
    ]
    await wait_for(
        lambda: any(all(r.state is RankState.EXITED for r in h.ranks) for h in healths),
        what="a last health with every rank exited",
    )
    latest = {i.id: i for i in incidents}  # JetStream order: the last transition wins
    assert not [i for i in latest.values() if i.state is not IncidentState.RESOLVED]
    assert not [i for i in incidents if i.kind is IncidentKind.STALLED]


async def _absent(store: Any, key: str) -> bool:
    return await store.get(key) is None


def _steps(events: list[StepEvent]) -> int:
    return max(e.step for e in events) + 1
