"""KILL_RESTART end to end (issue #5): 4 gloo ranks of antdt.demo.train under antdt-nd,
the host of rank 3 three times slower from step 30. The controller first re-sizes
batches, then restarts the job with rank 3 moved to a spare host slot; training resumes
from the checkpoint, at full speed, and every sample still reaches the model once."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import sys
from pathlib import Path

import pytest

from antdt.agent.samplelog import exactly_once_problems, read_sample_logs
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import ServiceSettings
from antdt.schemas import ActionRecord, ActionResult, RankHello, StepEvent, Subjects
from tests.e2e.conftest import start_services
from tests.secured import agent_env

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.integration]

WORLD, DATASET, BATCH, EPOCHS, ONSET, WINDOW = 4, 24000, 1024, 6, 30, 8


def restart_env(settings: ServiceSettings, job: str, out: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        **agent_env(settings, job),
        ANTDT_JOB=job,
        ANTDT_POLICY="antdt-nd",
        # A short run: a restart pays off when it saves a second over what is left.
        ANTDT_POLICY_PARAMS=json.dumps({"restart_cost_s": 0.5, "min_saving_ratio": 0.5}),
        ANTDT_DATASET_SIZE=str(DATASET),
        ANTDT_SHARD_SIZE="256",
        ANTDT_GLOBAL_BATCH=str(BATCH),
        ANTDT_EPOCHS=str(EPOCHS),
        ANTDT_SEED="7",
        ANTDT_INJECT=f"host=slot3,factor=3,from={ONSET}",  # the host, not the rank
        ANTDT_SAMPLE_LOG=str(out / "samples"),
        ANTDT_DEMO_OUT=str(out),
        ANTDT_DEMO_WIDTH="1024",
        ANTDT_DEMO_CKPT_DIR=str(out),
        ANTDT_DEMO_CKPT_EVERY="100000",  # checkpoints only when the controller asks
        ANTDT_TELEMETRY__LOG_FORMAT="json",
    )
    return env


def compute_speed(steps: list[StepEvent], first: int, last: int) -> float:
    """Median samples per compute-second of ranks 0-2 (never slowed) over steps
    [first, last]: the machine's speed then."""
    window = [e for e in steps if e.rank < 3 and first <= e.step <= last]
    rates = [e.samples / e.compute_s for e in window if e.samples and e.compute_s > 0]
    assert len(rates) >= 5, (first, last, len(rates))
    return statistics.median(rates)


def throughput(progress: list[dict[str, float]], first: int, last: int) -> float:
    """Samples per second over steps [first, last] of rank 0's progress records: the
    upper quartile of the per-step rates. The machine (the suite's own servers share its
    2 cores) only ever slows a step, and stalls a quarter of the steps at times, which
    moved the median by 0.2 between runs; a straggler, persistent, slows every step, so
    the upper quartile still shows one that was only worked around."""
    rows = sorted((r for r in progress if first <= r["step"] <= last), key=lambda r: r["step"])
    assert len(rows) >= 5, (first, last, len(rows))
    pairs = itertools.pairwise(rows)
    rates = [b["samples"] / (b["t"] - a["t"]) for a, b in pairs if b["t"] > a["t"]]
    return statistics.quantiles(rates, n=4)[2]


async def test_persistent_straggler_adjusted_then_restarted_on_a_healthy_slot(
    settings: ServiceSettings, bus: Bus, tmp_path: Path, unique: str
) -> None:
    from antdt.agent.launch import launch

    job = f"nd-{unique}"
    subjects = Subjects(settings.nats.subject_prefix)
    actions: list[ActionRecord] = []
    hellos: list[RankHello] = []
    steps: list[StepEvent] = []

    async def on_action(record: ActionRecord, _: Delivery) -> None:
        actions.append(record)

    async def on_step(event: StepEvent, _: Delivery) -> None:
        steps.append(event)

    async def on_hello(hello: RankHello, _: Delivery) -> None:
        hellos.append(hello)

    await bus.subscribe(subjects.action(job), ActionRecord, on_action)
    await bus.subscribe(subjects.hello(job, "*"), RankHello, on_hello)
    await bus.subscribe(subjects.step(job, "*"), StepEvent, on_step)
    await bus.flush()
    # δ = 0.5 (slow at 1.5x, the injected straggler runs at 2.5-4x): with a restart priced
    # this cheaply, the default 0.25 let noise pay for one. On a loaded CI machine rank 0
    # ran 1.25-1.5x slow for three windows before the onset; it was escalated a moment
    # before rank 3 and restarted instead, and the cooldown then held rank 3's restart.
    running = await start_services(settings, window=WINDOW, slow_threshold=0.5)
    try:
        command = [sys.executable, "-m", "antdt.demo.train"]
        env = restart_env(settings, job, tmp_path)
        rc = await asyncio.to_thread(launch, WORLD, command, env=env, spare_slots=1)
    finally:
        await running.runtime.shutdown()
    assert rc == 0
    applied = [a for a in actions if a.result == ActionResult.APPLIED]
    adjusts = [a for a in applied if a.kind == "adjust_batch"]
    restarts = [a for a in applied if a.kind == "kill_restart"]
    print("\n" + "\n".join(f"{a.kind} step={a.effective_step} {a.reason}" for a in applied))

    # 1. batches re-sized first: rank 3 relieved soon after the onset (detection takes up
    # to 2 windows; the plan takes effect a few steps later; noise on 2 shared cores can
    # cost another window)
    relieving = [a for a in adjusts if a.local_batch and a.local_batch[3] < BATCH // 4]
    assert relieving and relieving[0].effective_step is not None, adjusts
    first = relieving[0]
    print(f"rank 3 relieved from step {first.effective_step} (onset {ONSET})")
    assert first.effective_step is not None and first.effective_step <= ONSET + 4 * WINDOW

    # 2. then exactly one restart, moving rank 3 off slot3 to the spare slot
    assert len(restarts) == 1, restarts
    restart = restarts[0]
    assert (restart.rank, restart.host) == (3, "slot3")
    assert restart.effective_step is not None and restart.effective_step > first.effective_step
    moved = [h for h in hellos if h.rank == 3 and h.host == "slot4"]
    assert moved, [(h.rank, h.host) for h in hellos]

    # 3. after it, rank 3 is planned as healthy: a share no smaller than the others'. (Ranks
    # the detector judged normal count as equally fast, whatever their noisy speeds; one
    # it reported as a leader keeps its larger share. Equal ranks split what is left to
    # within a sample, the rounding's units going in rank order: a leader on rank 0 left
    # 752 of 1,024 samples, planned (272, 251, 251, 250).)
    later = [a for a in adjusts if (a.effective_step or 0) > restart.effective_step]
    assert later and later[0].local_batch is not None, later
    plan_after = later[0].local_batch
    assert plan_after[3] >= min(plan_after[:3]) - 1, plan_after

    # 4. resumed from the restart's checkpoint, at (nearly) full speed
    lines = read_sample_logs(tmp_path / "samples", WORLD)
    marks = {(ln["incarnation"], ln["restored"]) for ln in lines if "restored" in ln}
    assert marks == {(1, restart.effective_step)}
    progress = [json.loads(x) for x in (tmp_path / "progress.jsonl").read_text().splitlines()]
    before = throughput(progress, 5, ONSET - 1)
    last_step = max(r["step"] for r in progress)
    after = throughput(progress, restart.effective_step + 6, last_step)
    # The machine's own speed moves during a run (the suite's servers and the VM's
    # neighbours share its cores): once it ran 17% slower across every step after the
    # restart. Ranks 0-2 never straggle, so their compute speed is the machine's.
    machine = compute_speed(steps, restart.effective_step + 6, last_step) / compute_speed(
        steps, 5, ONSET - 1
    )
    print(
        f"throughput: before onset {before:.0f}/s, after restart {after:.0f}/s "
        f"({after / before:.2f}; the machine at {machine:.2f} of its speed before)"
    )
    # With rank 3 planned as healthy (checked above), what is left between the two figures
    # is any leader's share: 0.89-1.07 across runs here (machine included). A job still
    # behind the straggler, only batch-adjusted, runs at about 0.75.
    assert after >= 0.85 * before * min(machine, 1.0)

    # 5. and every sample of every epoch reached the final model exactly once
    assert exactly_once_problems(lines, DATASET, EPOCHS) == []
