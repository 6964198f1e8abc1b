"""AntDT under plain torchrun, single host (issue #35): the demo's training script, as
is, under `torchrun --standalone --max-restarts`, against real nats-server, etcd and the
three services. A rank killed -9 mid-epoch: torchrun restarts the workers, they restore
from the last checkpoint, and every sample id reaches the final model exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from antdt.agent.elastic import VARIABLES
from antdt.agent.launch import launch
from antdt.agent.samplelog import exactly_once_problems, read_sample_logs
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import ServiceSettings
from antdt.schemas import StepEvent, Subjects
from antdt.testing.torchrun import kill_rank, start_torchrun, stop, worker_pids
from tests.e2e.conftest import start_services
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.integration]

WORLD, DATASET, SHARD, BATCH, EPOCHS, EVERY = 2, 1280, 40, 64, 2, 5
#: Rank 1 is killed once rank 0 has stepped this far (epoch 0 has 20 steps).
KILL_AFTER = 8
DEMO = ["-m", "antdt.demo.train"]


def torchrun_env(settings: ServiceSettings, out: Path) -> dict[str, str]:
    """No ANTDT_JOB: the job is named by the run id torchrun --standalone makes."""
    env = {k: v for k, v in os.environ.items() if k != "ANTDT_JOB"}
    env.update(
        ANTDT_NATS__URL=settings.nats.url,
        ANTDT_NATS__SUBJECT_PREFIX=settings.nats.subject_prefix,
        ANTDT_DATASET_SIZE=str(DATASET),
        ANTDT_SHARD_SIZE=str(SHARD),
        ANTDT_GLOBAL_BATCH=str(BATCH),
        ANTDT_EPOCHS=str(EPOCHS),
        ANTDT_SEED="11",
        ANTDT_SAMPLE_LOG=str(out / "samples"),
        ANTDT_DEMO_OUT=str(out),
        ANTDT_DEMO_WIDTH="32",
        ANTDT_DEMO_CKPT_DIR=str(out),
        ANTDT_DEMO_CKPT_EVERY=str(EVERY),
        ANTDT_DEMO_MIN_STEP_S="0.05",  # paced, so that the kill lands mid-epoch
        OMP_NUM_THREADS="1",
        LOGLEVEL="INFO",  # torchrun says when it restarts the workers
        PYTHONUNBUFFERED="1",
        ANTDT_TELEMETRY__LOG_FORMAT="json",
    )
    return env


async def test_a_rank_killed_9_under_torchrun_is_restarted_and_loses_nothing(
    plain_settings: ServiceSettings, tmp_path: Path
) -> None:
    """On the plain servers (no users, no TLS): the job is named by the run id torchrun
    makes, unknown before it starts, so no agent user can be bound to it beforehand."""
    settings = plain_settings
    bus = await Bus(settings.nats, name="test").connect()
    try:
        await _killed_rank_restarted(settings, bus, tmp_path)
    finally:
        await bus.close()


async def _killed_rank_restarted(settings: ServiceSettings, bus: Bus, tmp_path: Path) -> None:
    steps: list[tuple[float, StepEvent]] = []

    async def on_step(event: StepEvent, _: Delivery) -> None:
        steps.append((time.monotonic(), event))

    subjects = Subjects(settings.nats.subject_prefix)
    await bus.subscribe(subjects.step("*", "*"), StepEvent, on_step)
    await bus.flush()
    running = await start_services(settings)
    env = torchrun_env(settings, tmp_path)
    proc = start_torchrun(WORLD, 2, DEMO, env, tmp_path / "torchrun.log")
    try:
        await wait_for(
            lambda: any(e.rank == 0 and e.step >= KILL_AFTER for _, e in steps),
            timeout=60,
            what=f"rank 0 past step {KILL_AFTER}",
        )
        first = worker_pids(proc.pid)
        assert kill_rank(proc.pid, 1) is not None
        killed_at = time.monotonic()
        rc = await asyncio.wait_for(asyncio.to_thread(proc.wait), 90)
    finally:
        stop(proc)
        await running.runtime.shutdown()
    log = (tmp_path / "torchrun.log").read_text(errors="replace")
    assert rc == 0, log[-3000:]
    assert "will restart worker group" in log  # torchrun's own restart, not a new launch

    jobs = {e.job for _, e in steps}
    assert len(jobs) == 1 and jobs != {"none"}, jobs  # the --standalone run id
    lines = read_sample_logs(tmp_path / "samples", WORLD)
    assert exactly_once_problems(lines, DATASET, EPOCHS) == []
    last_seen = max(e.step for t, e in steps if t < killed_at and e.rank == 1)
    marks = {(ln["incarnation"], ln["restored"]) for ln in lines if "restored" in ln}
    # The killed rank's last step event may have been in flight at the kill, or lost with
    # its outbox: it finished that step or one more. The restore is the newest checkpoint
    # (after steps 4, 9, 14, ...) up to there, or the one before if its commit was cut.
    newest = (last_seen + 2) // EVERY * EVERY - 1
    assert marks in ({(1, newest)}, {(1, newest - EVERY)}), (marks, last_seen)
    ((_, restored),) = marks
    again = {e.rank for t, e in steps if t > killed_at and e.step == restored + 1}
    assert again == {0, 1}, "both ranks trained the steps after the restore again"
    assert first.keys() == {0, 1}


SHOW_ENV = (
    "import json, os, sys; from pathlib import Path; "
    "Path(sys.argv[1], os.environ['RANK']).write_text(json.dumps(dict(os.environ)))"
)


@pytest.mark.parametrize("launcher", ["torchrun", "antdt-launch"])
def test_antdt_launch_gives_each_rank_what_torchrun_gives(tmp_path: Path, launcher: str) -> None:
    """The same contract variables, with the same meanings, from either launcher."""
    script = [sys.executable, "-c", SHOW_ENV, str(tmp_path)]
    if launcher == "torchrun":
        proc = start_torchrun(WORLD, 1, ["--no-python", *script], os.environ, tmp_path / "log")
        assert proc.wait(60) == 0, (tmp_path / "log").read_text()
    else:
        assert launch(WORLD, script, max_restarts=1, max_requested_restarts=0) == 0
    seen: list[dict[str, Any]] = [json.loads((tmp_path / str(r)).read_text()) for r in range(2)]
    for rank, env in enumerate(seen):
        assert set(VARIABLES) <= env.keys(), set(VARIABLES) - env.keys()
        assert env["RANK"] == env["LOCAL_RANK"] == env["ROLE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "2"
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("0", "1")
        assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "1")
    assert seen[0]["TORCHELASTIC_RUN_ID"] == seen[1]["TORCHELASTIC_RUN_ID"] != "none"
    assert seen[0]["MASTER_PORT"] == seen[1]["MASTER_PORT"]
