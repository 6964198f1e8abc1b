"""The real DLRover shard master as a same-run baseline (dlrover_real.py, on its own
Python). It runs from its own environment (DLRover needs the Kubernetes client): the
repository's `.venv-dlrover`, which `make bench` and `make bench-test` make, or the Python
that ANTDT_BENCH_DLROVER_PYTHON names."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from bench.children import ROOT
from bench.shards import percentiles

#: DLRover's release the bench measures (the Makefile installs this one).
DLROVER_VERSION = "0.6.1"
#: The Python with DLRover installed, unless ANTDT_BENCH_DLROVER_PYTHON says otherwise.
DEFAULT_PYTHON = ROOT / ".venv-dlrover" / "bin" / "python"
SCRIPT = Path(__file__).with_name("dlrover_real.py")
#: Longest answer line read from it, bytes: a run's answer lists every cycle's latency
#: (about 20 bytes each; 8 clients for 3 s came to 100 kB, past asyncio's 64 KiB default).
ANSWER_LIMIT = 64 * 2**20


def dlrover_python() -> Path | None:
    """The Python to run DLRover on, or None when there is none (said by the caller)."""
    configured = os.environ.get("ANTDT_BENCH_DLROVER_PYTHON")
    path = Path(configured) if configured else DEFAULT_PYTHON
    return path if path.exists() else None


class DLRoverMaster:
    """DLRover's LocalJobMaster and `workers` client processes, kept running; `run` asks
    for one timed run of `clients` of them, each a rank looping done-report + fetch."""

    def __init__(self, python: Path, log: Path, *, workers: int = 8) -> None:
        """`log`: where DLRover's own output goes (its warnings, a failure's reason)."""
        self.python = python
        self.log = log
        self.workers = workers
        self._process: asyncio.subprocess.Process | None = None
        self.address = ""

    async def __aenter__(self) -> DLRoverMaster:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as log:  # the child keeps its own descriptor
            self._process = await asyncio.create_subprocess_exec(
                str(self.python),
                str(SCRIPT),
                "--workers",
                str(self.workers),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                limit=ANSWER_LIMIT,
            )
        try:
            ready = await self._answer(timeout=180)
        except BaseException:
            await self.__aexit__()
            raise
        self.address = str(ready["master"])
        return self

    async def __aexit__(self, *exc: object) -> None:
        process = self._process
        if process is None:
            return
        self._process = None
        assert process.stdin is not None
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 20)
        except (TimeoutError, asyncio.TimeoutError):
            process.kill()
            await process.wait()

    async def run(self, clients: int, seconds: float) -> dict[str, float]:
        """Cycles/s, p50/p99 latency (ms) and CPU per cycle (µs) of the master and of
        the clients, over `seconds` with `clients` ranks."""
        process = self._process
        assert process is not None and process.stdin is not None, "not started"
        process.stdin.write(json.dumps({"clients": clients, "seconds": seconds}).encode() + b"\n")
        await process.stdin.drain()
        answer = await self._answer(timeout=seconds + 120)
        latencies: list[float] = answer["latencies"]
        cycles = len(latencies)
        return {
            "cycles": cycles,
            "cycles_per_s": cycles / seconds,
            **percentiles(latencies),
            "master_cpu_us_per_cycle": answer["master_cpu_s"] / cycles * 1e6,
            "client_cpu_us_per_cycle": answer["client_cpu_s"] / cycles * 1e6,
        }

    async def _answer(self, *, timeout: float) -> dict[str, Any]:
        process = self._process
        assert process is not None and process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), timeout)
        if not line:
            code = await process.wait()
            raise RuntimeError(
                f"the DLRover master ({SCRIPT.name}) exited with {code}; its log: {self.log}"
            )
        answer: dict[str, Any] = json.loads(line)
        return answer
