"""Local launch of N ranks (what `antdt launch` runs), and the process-group helper.

Every child gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
ANTDT_HOST=<prefix><rank> (so one machine can pose as N hosts for host-based injection),
runs in its own process group, and dies with the launcher (PR_SET_PDEATHSIG), even when
the launcher is killed -9. The death signal is tied to the thread that forked the child:
call launch() from a thread that outlives the children (the main thread)."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any

from antdt.runtime.servers import _die_with_parent, free_port

#: How long children get to exit after SIGTERM before SIGKILL, seconds.
GRACE_S = 5.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM)


def rank_env(
    base: Mapping[str, str], rank: int, nproc: int, port: int, host_prefix: str
) -> dict[str, str]:
    env = dict(base)
    # The launcher's ranks are authoritative: a stray ANTDT_RANK would outrank RANK.
    env.pop("ANTDT_RANK", None)
    env.pop("ANTDT_WORLD_SIZE", None)
    env.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        ANTDT_HOST=f"{host_prefix}{rank}",
    )  # fmt: skip
    return env


def exit_code(returncode: int) -> int:
    """A child's return code as a shell reports it (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def _signal_all(procs: Sequence[subprocess.Popen[bytes]], sig: int) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)


def _stop_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    _signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
    _signal_all(procs, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def _spawn(command: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(command), env=env, start_new_session=True, preexec_fn=_die_with_parent
    )


def launch(
    nproc: int,
    command: list[str],
    *,
    env: dict[str, str] | None = None,
    host_prefix: str = "slot",
    max_restarts: int = 0,
) -> int:
    """Run `command` as `nproc` ranks; returns 0 when all succeed, else the first
    non-zero exit code (the others are then stopped). `env` adds to os.environ.
    SIGINT/SIGTERM to the launcher are forwarded to every rank.

    When a rank fails, the whole group is stopped and, up to `max_restarts` times,
    started again (as torchrun does): each rank sees ANTDT_RESTART_COUNT (and
    TORCHELASTIC_RESTART_COUNT) and is expected to resume from its last checkpoint."""
    if nproc < 1:
        raise ValueError("nproc must be >= 1")
    if not command:
        raise ValueError("no command to launch")
    if max_restarts < 0:
        raise ValueError("max_restarts must be >= 0")
    base = {**os.environ, **(env or {})}
    stop_requested = threading.Event()  # the launcher was signalled: no restart then
    code = 0
    for attempt in range(max_restarts + 1):
        base.update(ANTDT_RESTART_COUNT=str(attempt), TORCHELASTIC_RESTART_COUNT=str(attempt))
        code = _run_group(nproc, command, base, host_prefix, stop_requested)
        if code == 0 or stop_requested.is_set():
            return code
        if attempt < max_restarts:
            print(f"antdt launch: a rank failed (exit {code}); restart {attempt + 1} of "
                  f"{max_restarts}", flush=True)  # fmt: skip
    return code


def _run_group(
    nproc: int, command: list[str], base: dict[str, str], host_prefix: str,
    stop_requested: threading.Event,
) -> int:  # fmt: skip
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    exits: queue.Queue[tuple[int, int]] = queue.Queue()
    restore = _forward_signals(procs, stop_requested)
    try:
        for rank in range(nproc):
            procs.append(_spawn(command, rank_env(base, rank, nproc, port, host_prefix)))
        for rank, proc in enumerate(procs):
            threading.Thread(
                target=lambda r=rank, p=proc: exits.put((r, p.wait())), daemon=True
            ).start()
        return _supervise(procs, exits)
    finally:
        _stop_all(procs)
        restore()


def _supervise(procs: list[subprocess.Popen[bytes]], exits: queue.Queue[tuple[int, int]]) -> int:
    first_failure = 0
    for _ in procs:
        while True:
            try:  # a timeout, so the main thread gets to run forwarded-signal handlers
                _, code = exits.get(timeout=0.5)
                break
            except queue.Empty:
                continue
        if code != 0 and first_failure == 0:
            first_failure = exit_code(code)
            _stop_all(procs)  # one rank failed: the collective job cannot go on
    return first_failure


def _forward_signals(procs: list[subprocess.Popen[bytes]], stop_requested: threading.Event) -> Any:
    """Install SIGINT/SIGTERM handlers that pass the signal to every rank (main thread
    only: elsewhere Python cannot install handlers). Returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def forward(signum: int, _: FrameType | None) -> None:
        stop_requested.set()
        _signal_all(procs, signum)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def init_process_group(backend: str = "gloo", timeout_s: float = 1800.0) -> None:
    """torch.distributed from the launcher's env (RANK, WORLD_SIZE, MASTER_ADDR/PORT);
    gloo on CPU by default. A no-op when already initialised."""
    from datetime import timedelta

    import torch.distributed as dist

    if dist.is_initialized():
        return
    rank = os.environ.get("RANK") or os.environ.get("ANTDT_RANK")
    world = os.environ.get("WORLD_SIZE") or os.environ.get("ANTDT_WORLD_SIZE")
    if rank is None or world is None or "MASTER_PORT" not in os.environ:
        raise RuntimeError("RANK, WORLD_SIZE and MASTER_ADDR/MASTER_PORT must be set")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=int(rank),
        world_size=int(world),
        timeout=timedelta(seconds=timeout_s),
    )
