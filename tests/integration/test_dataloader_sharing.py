"""Work sharing on the DataLoader path: 3 real gloo ranks (antdt launch) train from a
DataLoader with a worker process against the real services; rank 0 burns real CPU per
micro-batch from step 2 on, so it offers its share and the others read its ids from the
dataset and compute them. A plain module, and DDP with its reduction held off for the
micro-batches (`no_sync`), `step.sync` reducing by the samples each rank computed. Each
micro-batch's data is its ids' rows, each step's gradient equals one process on the
union of the step's samples (1e-9, float64), and every sample of the epoch reaches the
model exactly once: also when a helper is killed -9 holding a micro-batch it took over
and the group restarts from a checkpoint."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path

import pytest

from antdt.agent import launch
from antdt.agent.samplelog import exactly_once_problems, read_sample_logs
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import ServiceSettings
from antdt.schemas import StepEvent, Subjects
from tests.helpers import job_env
from tests.integration.agent_fixtures import real_services

pytest.importorskip("torch")
pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORLD, DATASET = 3, 288

SCRIPT = textwrap.dedent(
    """
    import contextlib, json, os, signal, sys, torch
    import torch.distributed as dist
    import antdt.agent

    class Rows(torch.utils.data.Dataset):
        def __init__(self, size):
            gen = torch.Generator().manual_seed(1)
            self.x = torch.randn(size, 4, generator=gen, dtype=torch.float64)
            self.y = torch.randn(size, 1, generator=gen, dtype=torch.float64)
        def __len__(self):
            return len(self.x)
        def __getitem__(self, i):
            return self.x[i], self.y[i], i

    def burn():  # real work, not a sleep
        a = torch.ones(120, 120, dtype=torch.float64)
        for _ in range(100):
            a = torch.tanh(a @ a.T / 120)

    torch.set_num_threads(1)
    antdt.agent.init_process_group(timeout_s=60)
    agent = antdt.agent.init()
    out, rank = sys.argv[1], agent.settings.rank
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    model = model.double()
    ddp, kill = sys.argv[2] == "ddp", sys.argv[2] == "killed"
    ckpt = out + ".model.pt"
    if agent.restarted():  # after the kill: the checkpoint's model, the ledger restored to it
        state = torch.load(ckpt, weights_only=True) if os.path.exists(ckpt) else None
        if state:
            model.load_state_dict(state["model"])
        agent.restore(state["step"] if state else None)
    if ddp:  # its reduction held off (no_sync) for every micro-batch: step.sync reduces
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = Rows(agent.spec.dataset_size)
    loader = torch.utils.data.DataLoader(
        data, batch_sampler=agent.batch_sampler(data), num_workers=1
    )
    took, worst, rows_ok = 0, 0.0, True
    for epoch in agent.epochs():
        for step, batch in agent.batches(loader):
            before = [p.detach().clone() for p in model.parameters()]
            with model.no_sync() if ddp else contextlib.nullcontext():
                for micro in step.claims():
                    x, y, ids = micro.batch
                    rows_ok &= ids.tolist() == micro.ids
                    if (
                        kill and micro.owner != rank and step.index >= 6
                        and agent.settings.restart_count == 0
                    ):  # killed holding a claim of rank 0's micro-batch, its rows read
                        with contextlib.suppress(FileExistsError):  # the first helper only
                            with open(f"{out}.killed.json", "x") as f:
                                json.dump({"rank": rank, "step": step.index, "ids": micro.ids}, f)
                            os.kill(os.getpid(), signal.SIGKILL)
                    if rank == 0 and step.index >= 2:
                        burn()
                    took += len(micro.ids) if micro.owner != rank else 0
                    loss = ((model(x) - y) ** 2).sum() / max(len(micro.ids), 1)
                    (loss * micro.weight).backward()
            step.sync(model)
            shares = [None] * dist.get_world_size()
            dist.all_gather_object(shares, step.sample_ids)
            union = [i for ids in shares for i in ids]
            reference = torch.nn.Sequential(
                torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1)
            ).double()
            with torch.no_grad():
                for p, b in zip(reference.parameters(), before):
                    p.copy_(b)
            ((reference(data.x[union]) - data.y[union]) ** 2).mean().backward()
            for got, want in zip(model.parameters(), reference.parameters()):
                worst = max(worst, float((got.grad - want.grad).abs().max()))
            opt.step()
            opt.zero_grad()
            if kill and (step.index + 1) % 4 == 0:
                agent.commit(step.index)
                if rank == 0:
                    torch.save({"model": model.state_dict(), "step": step.index}, ckpt + ".tmp")
                    os.replace(ckpt + ".tmp", ckpt)
                dist.barrier()
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump({"took": took, "worst": worst, "rows_ok": rows_ok}, f)
    agent.close()
    antdt.agent.destroy_process_group()
    """
)


@pytest.mark.parametrize("wrap", ["module", "ddp"])
async def test_dataloader_batches_are_shared_with_exact_gradients_and_samples_once(
    settings: ServiceSettings, unique: str, bus: Bus, tmp_path: Path, wrap: str
) -> None:
    out, events = await train(settings, unique, bus, tmp_path, wrap)
    problems = exactly_once_problems(read_sample_logs(out, WORLD), DATASET, epochs=1)
    assert not problems, problems
    runs = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(WORLD)]
    assert all(run["rows_ok"] for run in runs), runs
    assert max(run["worst"] for run in runs) < 1e-9, runs
    assert runs[1]["took"] + runs[2]["took"] > 0, runs  # rank 0's ids computed by others
    helped = [e for e in events if e.helped and 0 in e.helped]
    assert helped and all(e.rank != 0 for e in helped), helped


async def test_a_helper_killed_9_holding_a_taken_over_micro_batch_loses_and_repeats_nothing(
    settings: ServiceSettings, unique: str, bus: Bus, tmp_path: Path
) -> None:
    """The first helper (rank 1 or 2; the machine's timing decides which) to hold a claim
    of rank 0's micro-batch from step 6 on is killed -9 then (its rows read from the
    dataset, not yet computed), two epochs, a checkpoint every 4 steps; the group restarts
    from the last one and goes on sharing. Nothing of the killed step reached the model
    (its ids reach it only through the gradient all-reduce every rank must join); every
    sample of each epoch once, gradients exact before and after the restart."""
    out, events = await train(settings, unique, bus, tmp_path, "killed", epochs=2)
    killed = json.loads(Path(f"{out}.killed.json").read_text())
    assert killed["rank"] in (1, 2) and killed["step"] >= 6 and killed["ids"], killed
    lines = read_sample_logs(out, WORLD)
    assert exactly_once_problems(lines, DATASET, epochs=2) == []
    restored = {ln["restored"] for ln in lines if "restored" in ln}
    assert restored and max(restored) < killed["step"], (restored, killed)
    runs = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(WORLD)]
    assert all(run["rows_ok"] for run in runs), runs
    assert max(run["worst"] for run in runs) < 1e-9, runs
    after = [e for e in events if e.helped and 0 in e.helped and e.step > killed["step"]]
    assert after, "no sharing after the restart"


async def train(
    settings: ServiceSettings,
    unique: str,
    bus: Bus,
    tmp_path: Path,
    wrap: str,
    epochs: int = 1,
) -> tuple[Path, list[StepEvent]]:
    """The script under `antdt launch` (restarted once after a failure) against the real
    services; its sample-log prefix and the step events published."""
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
            ANTDT_DATASET_SIZE=str(DATASET),
            ANTDT_SHARD_SIZE="8",
            ANTDT_GLOBAL_BATCH="24",
            ANTDT_EPOCHS=str(epochs),
            ANTDT_POLICY="none",
            ANTDT_POLICY_PARAMS=json.dumps({"work_sharing": "on", "share_chunks": 4}),
            ANTDT_SAMPLE_LOG=str(out),
            ANTDT_TELEMETRY__LOG_LEVEL="warning",
        )
        command = [sys.executable, str(script), str(out), wrap]
        running = asyncio.to_thread(launch, WORLD, command, env=env, max_restarts=1)
        assert await asyncio.wait_for(running, 240) == 0
        await asyncio.sleep(0.5)  # the last step events, published as the ranks closed
    return out, events
