"""A job under plain torchrun, as a user starts it, and a rank killed -9 from outside
(tests and bench). Linux only: ranks are found by their environment in /proc."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from antdt.testing.foreground import descendants


def torchrun_command(nproc: int, max_restarts: int, script: Sequence[str]) -> list[str]:
    """`torchrun --standalone --nnodes=1 --nproc-per-node=N --max-restarts=M <script>`
    (the venv's torchrun, else the same through `python -m torch.distributed.run`);
    `script` as torchrun takes it: `train.py ...`, `-m module ...`, `--no-python cmd ...`."""
    beside = Path(sys.executable).with_name("torchrun")
    found = str(beside) if beside.exists() else shutil.which("torchrun")
    launcher = [found] if found else [sys.executable, "-m", "torch.distributed.run"]
    flags = [
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
    ]
    return [*launcher, *flags, *script]


def start_torchrun(
    nproc: int, max_restarts: int, script: Sequence[str], env: Mapping[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """Start torchrun in its own session (end it with `stop`), its output to `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            torchrun_command(nproc, max_restarts, script),
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def worker_pids(launcher: int) -> dict[int, int]:
    """{RANK: pid} of the live workers below `launcher` (those with RANK in their env)."""
    found: dict[int, int] = {}
    for pid in descendants(launcher):
        rank = environ_of(pid).get("RANK")
        if rank is not None and rank.isdigit():
            found.setdefault(int(rank), pid)  # a worker's own children come after it
    return found


def kill_rank(launcher: int, rank: int) -> int | None:
    """SIGKILL rank `rank`'s worker below `launcher`; its pid (None: no such worker)."""
    pid = worker_pids(launcher).get(rank)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    return pid


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """End torchrun and its workers (SIGTERM to its session, then SIGKILL)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue


def environ_of(pid: int) -> dict[str, str]:
    """The environment process `pid` started with ({} when it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
