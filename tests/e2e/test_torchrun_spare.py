"""KILL_RESTART onto a spare node under plain torchrun (`--rdzv-backend=antdt`), on
loopback: nodes node-a and node-b train the demo's script (2 gloo ranks), node-c starts
after their round is up and waits as a spare. A KILL_RESTART moves node-b's rank: its
torchrun is refused at the next round (exit 76, its message), node-c joins, the ranks
restore from the checkpoint, the job finishes, and every sample reaches the model once."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from antdt.agent.restart import BLOCKED_EXIT_CODE
from antdt.agent.samplelog import exactly_once_problems, read_sample_logs
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import ServiceSettings
from antdt.schemas import ActionRecord, ActionResult, NodeState, RankHello, Subjects
from antdt.services.controller.actions import KillRestartAction, restart_action_id
from antdt.services.controller.service import ControllerService
from tests.e2e.conftest import start_services
from tests.helpers import wait_for
from tests.secured import agent_env

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.integration]

WORLD, DATASET, BATCH, EPOCHS = 2, 25600, 128, 1
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_env(settings: ServiceSettings, job: str, host: str, out: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        ANTDT_HOST=host,
        **agent_env(settings, job),
        ANTDT_JOB=job,
        ANTDT_POLICY="none",  # the test decides the restart
        ANTDT_DATASET_SIZE=str(DATASET),
        ANTDT_SHARD_SIZE="128",
        ANTDT_GLOBAL_BATCH=str(BATCH),
        ANTDT_EPOCHS=str(EPOCHS),
        ANTDT_SEED="5",
        ANTDT_SAMPLE_LOG=str(out / "samples"),
        ANTDT_DEMO_OUT=str(out / host),
        ANTDT_DEMO_WIDTH="64",
        ANTDT_DEMO_MIN_STEP_S="0.1",
        ANTDT_DEMO_CKPT_DIR=str(out),  # one folder, as shared storage would be
        ANTDT_DEMO_CKPT_EVERY="100000",  # checkpoints only when the controller asks
        ANTDT_TELEMETRY__LOG_FORMAT="json",
        OMP_NUM_THREADS="1",
    )
    (out / host).mkdir(parents=True, exist_ok=True)
    return env


def torchrun(
    settings: ServiceSettings, job: str, host: str, port: int, out: Path, *, store_host: bool
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2:2",
        "--nproc-per-node=1",
        "--rdzv-backend=antdt",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={job}",
        f"--rdzv-conf=is_host={int(store_host)}",
        "--max-restarts=3",
        "--monitor-interval=0.5",
        "-m",
        "antdt.demo.train",
    ]
    log = (out / f"{host}.log").open("wb")
    return subprocess.Popen(
        command, env=node_env(settings, job, host, out), stdout=log, stderr=subprocess.STDOUT
    )


async def exit_code(proc: subprocess.Popen[bytes], timeout: float) -> int:
    return await asyncio.wait_for(asyncio.to_thread(proc.wait), timeout)


async def test_a_blocklisted_node_leaves_and_a_waiting_spare_takes_its_rank(
    settings: ServiceSettings, bus: Bus, tmp_path: Path, unique: str
) -> None:
    job, port = f"spare-{unique}", free_port()
    subjects = Subjects(settings.nats.subject_prefix)
    hellos: list[RankHello] = []
    actions: list[ActionRecord] = []

    async def on_hello(hello: RankHello, _: Delivery) -> None:
        hellos.append(hello)

    async def on_action(record: ActionRecord, _: Delivery) -> None:
        actions.append(record)

    await bus.subscribe(subjects.hello(job, "*"), RankHello, on_hello)
    await bus.subscribe(subjects.action(job), ActionRecord, on_action)
    running = await start_services(settings, window=8)
    controller: ControllerService = running.by_name["controller"]
    nodes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        nodes["node-a"] = torchrun(settings, job, "node-a", port, tmp_path, store_host=True)
        await asyncio.sleep(0.5)  # node-a hosts the rendezvous store
        nodes["node-b"] = torchrun(settings, job, "node-b", port, tmp_path, store_host=False)
        # node-c starts once the first round trains: torch elastic keeps it waiting.
        state = await wait_for(
            lambda: (s := controller.jobs.get(job)) and s.health and s,
            timeout=60,
            what="the first round training",
        )
        nodes["node-c"] = torchrun(settings, job, "node-c", port, tmp_path, store_host=False)
        await wait_for(
            lambda: (
                state.view(time.time()).free_spares == ("node-c",)
                and state.nodes["node-c"].state == NodeState.WAITING
            ),
            timeout=30,
            what="node-c registered as a waiting spare",
        )
        hosts = state.view(time.time()).hosts
        moved = next(rank for rank, host in hosts.items() if host == "node-b")
        async with state.busy:  # as a policy's decision would run
            view = state.view(time.time(), controller.blocklist.hosts(time.time()))
            action = KillRestartAction(
                action_id=restart_action_id(view), rank=moved, host="node-b", reason="test"
            )
            record = await controller.executor.apply(state, action, view)
        assert record.result == ActionResult.APPLIED, record

        rc_b = await exit_code(nodes["node-b"], 60)
        rc_a = await exit_code(nodes["node-a"], 120)
        rc_c = await exit_code(nodes["node-c"], 30)
        # The restart cost was measured with the rank on its new host.
        await wait_for(lambda: state.restarts.costs, timeout=10, what="restart cost")
    finally:
        for proc in nodes.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        await running.runtime.shutdown()
    log_b = (tmp_path / "node-b.log").read_text(errors="replace")
    assert rc_b == BLOCKED_EXIT_CODE, log_b[-3000:]
    assert "antdt: node node-b may not join job" in log_b and "blocklisted" in log_b
    assert (rc_a, rc_c) == (0, 0), (tmp_path / "node-c.log").read_text(errors="replace")[-3000:]
    assert any(h.host == "node-c" for h in hellos), [(h.rank, h.host) for h in hellos]
    assert not any(h.host == "node-b" and h.started_at > record.decided_at for h in hellos)
    lines = read_sample_logs(tmp_path / "samples", WORLD)
    assert {ln["restored"] for ln in lines if "restored" in ln} == {record.effective_step}
    assert exactly_once_problems(lines, DATASET, EPOCHS) == []
