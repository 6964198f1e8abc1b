"""Local launch of N ranks (what `antdt launch` runs; the process-group helpers are in
antdt.agent.group). Each rank sees what torchrun would give it (antdt.agent.elastic), so
one code path serves.

Each rank runs in its own process group and dies with the launcher, even a killed -9
one: its death signal is tied to the forking thread, so call launch() from a thread that
outlives the children (the main thread)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from antdt.agent.elastic import WorkerEnv, worker_environ
from antdt.agent.restart import RESTART_EXIT_CODE
from antdt.runtime.servers import die_with_parent, free_port

#: How long children get to exit after SIGTERM before SIGKILL, seconds.
GRACE_S = 5.0
#: How long the other ranks get to finish their checkpoint and exit, seconds.
RESTART_GRACE_S = 120.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class Run:
    """What every rank of one group start shares: the run id, the restarts so far and
    the budget, and where the process group meets."""

    run_id: str
    restart_count: int
    max_restarts: int
    port: int


def rank_env(base: Mapping[str, str], rank: int, nproc: int, run: Run, host: str) -> dict[str, str]:
    """Rank `rank`'s environment: torchrun's worker contract (one node, one role), and
    the slot it poses as (ANTDT_HOST: one machine poses as N hosts for injection)."""
    worker = WorkerEnv(
        rank=rank,
        local_rank=rank,
        world_size=nproc,
        local_world_size=nproc,
        group_rank=0,
        group_world_size=1,
        restart_count=run.restart_count,
        max_restarts=run.max_restarts,
        run_id=run.run_id,
        master_addr="127.0.0.1",
        master_port=run.port,
    )
    return {**worker_environ(base, worker), "ANTDT_HOST": host}


@dataclass
class Slots:
    """Which host slot each rank runs on. One machine poses as `nproc + spare` hosts
    (`<prefix><n>`); a restart requested with hosts to avoid moves their ranks to spare
    slots, which stand in for healthy nodes (injected slowdowns name the old host)."""

    nproc: int
    spare: int = 0
    prefix: str = "slot"
    avoided: set[str] = field(default_factory=set)
    hosts: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.hosts = [f"{self.prefix}{rank}" for rank in range(self.nproc)]

    def avoid(self, hosts: list[str]) -> list[str]:
        """Move ranks off `hosts`; returns the moves made, as 'rank r: old -> new'."""
        self.avoided.update(hosts)
        free = [f"{self.prefix}{n}" for n in range(self.nproc + self.spare)]
        free = [h for h in free if h not in self.avoided and h not in self.hosts]
        moves = []
        for rank, host in enumerate(self.hosts):
            if host in self.avoided and free:
                self.hosts[rank] = free.pop(0)
                moves.append(f"rank {rank}: {host} -> {self.hosts[rank]}")
        return moves


def read_restart_requests(folder: Path) -> list[str]:
    """Hosts the ranks were told to avoid (agent.exit_for_restart writes them); the
    files are consumed."""
    hosts: list[str] = []
    for path in sorted(folder.glob("restart-*.json")):
        with contextlib.suppress(OSError, ValueError):
            hosts.extend(json.loads(path.read_text()).get("avoid_hosts", []))
        path.unlink(missing_ok=True)
    return hosts


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


def _spawn(
    command: Sequence[str], env: dict[str, str], core: int | None = None
) -> subprocess.Popen[bytes]:
    def before_exec() -> None:
        die_with_parent()
        if core is not None:  # its threads, and whatever it starts, stay on that core
            os.sched_setaffinity(0, {core})

    return subprocess.Popen(list(command), env=env, start_new_session=True, preexec_fn=before_exec)


def launch(
    nproc: int,
    command: list[str],
    *,
    env: dict[str, str] | None = None,
    host_prefix: str = "slot",
    max_restarts: int = 0,
    spare_slots: int = 0,
    max_requested_restarts: int = 3,
    cores: Sequence[int] = (),
) -> int:
    """Run `command` as `nproc` ranks (`env` adds to os.environ); returns 0 when all
    succeed, else the first non-zero exit code. Restarts the whole group after a failure
    (up to `max_restarts`) and when the ranks exit with RESTART_EXIT_CODE (up to
    `max_requested_restarts`, moving ranks to `spare_slots`). SIGINT/SIGTERM are
    forwarded to every rank. With `cores`, rank r runs on core cores[r % len(cores)] only.
    Each rank gets torchrun's worker environment (antdt.agent.elastic); its
    TORCHELASTIC_MAX_RESTARTS is both budgets together."""
    if nproc < 1:
        raise ValueError("nproc must be >= 1")
    if not command:
        raise ValueError("no command to launch")
    if max_restarts < 0 or max_requested_restarts < 0 or spare_slots < 0:
        raise ValueError("restart and slot counts must be >= 0")
    if set(cores) - os.sched_getaffinity(0):
        raise ValueError(
            f"cores {sorted(cores)}: this process may run on {sorted(os.sched_getaffinity(0))}"
        )
    pinning = [cores[rank % len(cores)] if cores else None for rank in range(nproc)]
    base = {**os.environ, **(env or {})}
    stop_requested = threading.Event()  # the launcher was signalled: no restart then
    slots = Slots(nproc, spare_slots, host_prefix)
    failures = requested = 0
    run_id = uuid.uuid4().hex  # as torchrun --standalone: one id for the launch
    budget = max_restarts + max_requested_restarts
    with tempfile.TemporaryDirectory(prefix="antdt-launch-") as folder:
        base["ANTDT_LAUNCH_DIR"] = folder
        while True:
            run = Run(run_id, failures + requested, budget, free_port())
            code = _run_group(command, base, run, slots.hosts, pinning, stop_requested)
            if code == 0 or stop_requested.is_set():
                return code
            if code == RESTART_EXIT_CODE and requested < max_requested_restarts:
                requested += 1
                moves = slots.avoid(read_restart_requests(Path(folder)))
                moved = "; ".join(moves) or "no host moved"
                _say(f"restart requested ({requested}/{max_requested_restarts}); {moved}")
            elif code != RESTART_EXIT_CODE and failures < max_restarts:
                failures += 1
                _say(f"a rank failed (exit {code}); restart {failures} of {max_restarts}")
            else:
                return code


def _say(message: str) -> None:
    print(f"antdt launch: {message}", flush=True)


def _run_group(
    command: list[str],
    base: dict[str, str],
    run: Run,
    hosts: list[str],
    pinning: list[int | None],
    stop_requested: threading.Event,
) -> int:
    nproc = len(pinning)
    procs: list[subprocess.Popen[bytes]] = []
    exits: queue.Queue[tuple[int, int]] = queue.Queue()
    restore = _forward_signals(procs, stop_requested)
    try:
        for rank in range(nproc):
            env = rank_env(base, rank, nproc, run, hosts[rank])
            procs.append(_spawn(command, env, pinning[rank]))
        for rank, proc in enumerate(procs):
            threading.Thread(
                target=lambda r=rank, p=proc: exits.put((r, p.wait())), daemon=True
            ).start()
        return _supervise(procs, exits)
    finally:
        _stop_all(procs)
        restore()


def _supervise(procs: list[subprocess.Popen[bytes]], exits: queue.Queue[tuple[int, int]]) -> int:
    """Wait for every rank. A failure stops the others (the collective job cannot go
    on); a requested restart lets them finish their checkpoint and exit by themselves,
    for up to RESTART_GRACE_S."""
    first = 0
    restart_deadline: float | None = None
    for _ in procs:
        while True:
            try:  # a timeout, so the main thread gets to run forwarded-signal handlers
                _, code = exits.get(timeout=0.5)
                break
            except queue.Empty:
                if restart_deadline is not None and time.monotonic() > restart_deadline:
                    _stop_all(procs)
                    restart_deadline = None
        code = exit_code(code)
        if code == 0 or first not in (0, RESTART_EXIT_CODE):
            continue
        if code == RESTART_EXIT_CODE:
            first = first or code
            if restart_deadline is None:
                restart_deadline = time.monotonic() + RESTART_GRACE_S
        else:
            first = code
            _stop_all(procs)
    return first


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
