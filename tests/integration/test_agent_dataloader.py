"""Real torch ranks (gloo, antdt launch) training from a DataLoader with 2 worker
processes against the real services: a commanded plan switch re-cuts the batches read
ahead and applies at its step, rank 1 is killed -9 mid-epoch, the group restarts from the
last checkpoint, and every sample of both epochs reaches the final model exactly once."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from antdt.agent import launch
from antdt.agent.samplelog import exactly_once_problems, read_sample_logs
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import ServiceSettings
from antdt.schemas import Ack, AdjustBatch, Plan, StepEvent, Subjects
from tests.helpers import job_env, wait_for
from tests.integration.agent_fixtures import real_services

pytest.importorskip("torch")
pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, torch
    import antdt.agent

    class Rows(torch.utils.data.Dataset):
        def __init__(self, size):
            self.x = torch.linspace(-1, 1, size * 4).reshape(size, 4)
        def __len__(self):
            return len(self.x)
        def __getitem__(self, i):
            return self.x[i], self.x[i].sum(dim=0, keepdim=True) * 0.5, i

    torch.set_num_threads(1)
    antdt.agent.init_process_group(timeout_s=60)
    agent = antdt.agent.init()
    out, rank = sys.argv[1], agent.settings.rank
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ckpt = out + ".model.pt"
    if agent.restarted():
        state = torch.load(ckpt, weights_only=True) if os.path.exists(ckpt) else None
        if state:
            model.load_state_dict(state["model"])
        agent.restore(state["step"] if state else None)
    data = Rows(agent.spec.dataset_size)
    loader = torch.utils.data.DataLoader(
        data, batch_sampler=agent.batch_sampler(data), num_workers=2, prefetch_factor=2,
        persistent_workers=rank == 1,
    )
    sizes = []
    for epoch in agent.epochs():
        for step, batch in agent.batches(loader):
            if batch is not None:
                x, y, ids = batch
                assert ids.tolist() == step.sample_ids, (ids.tolist(), step.sample_ids)
                # The plan's (4, 4) then (6, 2); at an epoch's tail a rank with data left
                # takes the share of one that ran out, up to the plan's largest batch.
                assert len(ids) <= 6, (len(ids), step)
                ((model(x) - y) ** 2).mean().backward()
            else:
                assert step.sample_ids == []
            step.sync(model)
            opt.step()
            opt.zero_grad()
            sizes.append([step.index, step.local_batch, len(step.sample_ids)])
            if (step.index + 1) % 6 == 0:
                agent.commit(step.index)
                with open(f"{out}.rank{rank}.run{agent.settings.restart_count}.json", "w") as f:
                    json.dump({"recuts": agent.loader_recuts, "sizes": sizes}, f)
                if rank == 0:
                    torch.save({"model": model.state_dict(), "step": step.index}, ckpt + ".tmp")
                    os.replace(ckpt + ".tmp", ckpt)
                torch.distributed.barrier()
            if rank == 1 and step.index == 40 and agent.settings.restart_count == 0:
                os.kill(os.getpid(), signal.SIGKILL)
    with open(f"{out}.rank{rank}.run{agent.settings.restart_count}.json", "w") as f:
        json.dump({"recuts": agent.loader_recuts, "sizes": sizes}, f)
    agent.close()
    antdt.agent.destroy_process_group()
    """
)


async def test_dataloader_workers_plan_switch_and_kill_restore_exactly_once(
    settings: ServiceSettings, unique: str, bus: Bus, tmp_path: Path
) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    events: list[StepEvent] = []

    async def on_step(event: StepEvent, _: Delivery) -> None:
        events.append(event)

    async with real_services(settings):
        await bus.subscribe(subjects.step(unique, "*"), StepEvent, on_step)
        await bus.flush()
        script = tmp_path / "train.py"
        script.write_text(SCRIPT)
        out = tmp_path / "run"
        env = job_env(
            settings,
            unique,
            ANTDT_DATASET_SIZE="240",
            ANTDT_SHARD_SIZE="10",
            ANTDT_GLOBAL_BATCH="8",
            ANTDT_EPOCHS="2",
            ANTDT_SAMPLE_LOG=str(out),
            ANTDT_TELEMETRY__LOG_LEVEL="warning",
        )
        command = [sys.executable, str(script), str(out)]
        run = asyncio.ensure_future(asyncio.to_thread(launch, 2, command, env=env, max_restarts=1))
        await wait_for(
            lambda: any(e.step >= 5 for e in events) or run.done(), timeout=90, what="step 5"
        )
        # Effective at once: it applies at the next step not yet begun, which the loaders'
        # workers have already read ahead under the old plan.
        new = Plan(
            job=unique, version=1, local_batch=(6, 2), effective_step=0, created_at=time.time()
        )
        command_ = AdjustBatch(action_id="a1", job=unique, plan=new)
        acks = [await bus.request(subjects.command(unique, r), command_, Ack) for r in range(2)]
        assert await asyncio.wait_for(run, 180) == 0

    problems = exactly_once_problems(read_sample_logs(out, 2), 240, epochs=2)
    assert not problems, problems
    assert all(a.ok for a in acks), acks
    first = [json.loads(Path(f"{out}.rank{r}.run0.json").read_text()) for r in range(2)]
    assert all(run["recuts"] >= 1 for run in first), first  # old-size batches read ahead
    # Sent to one rank after the other, effective at once: each acked the earliest step
    # it could start at; both start it at one step, the first after a count that found
    # both holding it (a rank alone on the new plan would have run a step of another
    # global batch).
    earliest = max(a.applied_step or 0 for a in acks)
    first_run = [e for e in events if e.step < 36]  # before the kill's checkpoint (step 35)
    switched = {
        r: min(e.step for e in first_run if e.rank == r and e.plan_version == 1) for r in range(2)
    }
    assert switched[0] == switched[1] >= earliest, (switched, acks)
    for e in first_run:
        at = switched[e.rank]
        assert e.local_batch == ((6, 2)[e.rank] if e.step >= at else 4), e
        assert e.samples <= (6 if e.step >= at else 4)
    restarted = {r: json.loads(Path(f"{out}.rank{r}.run1.json").read_text()) for r in range(2)}
    assert all(run["sizes"][0][0] == 36 for run in restarted.values()), restarted
