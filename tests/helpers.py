"""Test helpers: wait for a condition with a deadline instead of sleeping; service
replicas as real processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from antdt.runtime.bus import Bus, RequestRefused
from antdt.runtime.config import ServiceSettings
from antdt.runtime.store import Store
from antdt.schemas import ErrorReply, Keys, StepEvent
from tests.secured import agent_env

T = TypeVar("T")


def step_event(
    job: str,
    rank: int,
    n: int,
    *,
    compute_s: float = 0.1,
    comm_s: float = 0.01,
    samples: int = 4,
    step_s: float | None = None,
    started_at: float | None = None,
) -> StepEvent:
    """Rank `rank`'s step `n` of `job` on host h{rank}: `samples` samples, `compute_s` of
    compute, `comm_s` of communication, no data wait; it starts at 1000 + n by default."""
    wall = compute_s + comm_s if step_s is None else step_s
    start = 1000.0 + n if started_at is None else started_at
    return StepEvent(
        job=job,
        rank=rank,
        host=f"h{rank}",
        step=n,
        epoch=0,
        plan_version=0,
        local_batch=samples,
        samples=samples,
        compute_s=compute_s,
        data_wait_s=0.0,
        comm_s=comm_s,
        step_s=wall,
        started_at=start,
        ended_at=start + wall,
    )


async def wait_for(
    condition: Callable[[], Any | Awaitable[Any]],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> Any:
    """Poll `condition` (sync or async) until it returns a truthy value; return it."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value) or isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def wait_for_sync(
    condition: Callable[[], Any], *, timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or 'condition'}")
        time.sleep(interval)


async def monitor_owner(store: Store, keys: Keys, job: str, *, timeout: float = 15.0) -> str:
    """Wait until a monitor replica owns `job` and return its id: from then on its steps
    reach that replica (a replica subscribes to a job's steps before it claims it). A
    job is claimed on its ranks' hellos, or by a claim round (half the lease TTL)."""
    got = await wait_for(
        lambda: store.get(keys.owner("monitor", job)),
        timeout=timeout,
        what=f"a monitor replica owns {job}",
    )
    return str(got.value.decode())


@contextlib.contextmanager
def service_replicas(
    service: str,
    settings: ServiceSettings,
    names: list[str],
    logs: Path,
    extra_env: dict[str, str] | None = None,
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """One `antdt <service>` process per name (its replica id), on the test's servers and
    prefixes; each logs to logs/<name>.log; whatever is left is killed on exit."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    env = {
        **os.environ,
        "ANTDT_ETCD__LEASE_TTL_S": str(settings.etcd.lease_ttl_s),
        "ANTDT_NATS__SUBJECT_PREFIX": settings.nats.subject_prefix,
        "ANTDT_ETCD__KEY_PREFIX": settings.etcd.key_prefix,
        "ANTDT_TELEMETRY__LOG_FORMAT": "json",
        **(extra_env or {}),
    }
    try:
        for name in names:
            out = (logs / f"{name}.log").open("wb")
            procs[name] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "antdt.cli",
                    service,
                    "--nats-url",
                    settings.nats.url,
                    "--etcd-endpoint",
                    settings.etcd.endpoint,
                ],
                env={**env, "ANTDT_REPLICA_ID": name},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        yield procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


async def refusal(
    bus: Bus, subject: str, raw: bytes, reply_type: type[BaseModel], timeout: float = 5.0
) -> ErrorReply:
    """The ErrorReply that `raw` (bad input) gets on `subject`, its Antdt-Reply header
    checked by the bus (the suite requires it); fails if it was answered as accepted."""
    try:
        accepted = await bus.request_bytes(subject, raw, reply_type, timeout=timeout)
    except RequestRefused as refused:
        return refused.reply
    raise AssertionError(f"{raw!r} on {subject} was accepted: {accepted!r}")


def job_env(settings: ServiceSettings, job: str, **fields: str) -> dict[str, str]:
    """The ANTDT_* environment of a rank of `job` on the test's bus: its NATS server and
    subject prefix (and the job's agent user, on secured servers), plus `fields` (e.g.
    ANTDT_DATASET_SIZE="240")."""
    return {**agent_env(settings, job), "ANTDT_JOB": job, **fields}


def table_row(output: str, first_cell: str) -> str:
    """The line of a rich table printed in `output` whose first cell is `first_cell`.

    Matches table rows only: services running in the test process log to the stdout that
    click's CliRunner captures, so a log line may name the same job."""
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.split("│")]
        if len(cells) > 2 and cells[1] == first_cell:
            return line
    raise AssertionError(f"no table row for {first_cell!r} in:\n{output}")
