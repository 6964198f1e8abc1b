"""`make gpu-check`: the gpu-marked tests, then a short training run of the demo on CUDA
(nccl, one rank per GPU, up to 8) under `antdt launch` against a real control plane
(embedded nats-server and etcd, the three services in their own process), then the FSDP2
example there; prints the runs' figures. Exits non-zero with a one-line reason where no
CUDA device is present. Results also go to runs/gpu-check/results.json."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.display import console

DATASET, GLOBAL_BATCH, EPOCHS = 153_600, 1024, 2  # 150 steps an epoch: 300 steps
WARMUP_STEPS = 10  # imports, NCCL's first collectives, the allocator and kernels warm up
TRAIN_TIMEOUT_S = 150.0
TESTS_TIMEOUT_S = 240.0
FSDP2_SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "fsdp2" / "train.py"
FSDP2_DATASET = 4096


def no_cuda_reason(torch: Any) -> str | None:
    """Why this machine cannot run the check (None: it can)."""
    if torch is None:
        return "no CUDA device: torch is not installed"
    if torch.cuda.is_available():
        return None
    build = torch.version.cuda or "none, a CPU build"
    return f"no CUDA device: torch {torch.__version__} sees none (its CUDA: {build})"


def figures(progress: list[dict[str, Any]], warmup: int = WARMUP_STEPS) -> dict[str, float]:
    """Throughput and step time from rank 0's step ends (`t`, `samples`), past `warmup`."""
    rows = sorted(progress, key=lambda p: p["step"])[warmup:]
    if len(rows) < 3:
        raise ValueError(f"{len(progress)} steps recorded: too few past {warmup} warm-up steps")
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(rows)]
    elapsed = rows[-1]["t"] - rows[0]["t"]
    samples = sum(p["samples"] for p in rows[1:])
    return {
        "steps": len(progress),
        "steps_per_s": len(gaps) / elapsed,
        "samples_per_s": samples / elapsed,
        "step_ms_mean": 1000 * statistics.fmean(gaps),
        "step_ms_p50": 1000 * statistics.median(gaps),
        "step_ms_p95": 1000 * sorted(gaps)[math.ceil(0.95 * len(gaps)) - 1],  # nearest rank
    }


def machine(torch: Any) -> dict[str, Any]:
    nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    return {
        "gpu": torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
    }


def run_tests() -> int:
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rs"]
    try:
        return subprocess.run([*argv, "tests/gpu"], timeout=TESTS_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        return 124


@contextlib.contextmanager
def control_plane(out: Path) -> Iterator[str]:
    """Embedded servers and the three services in their own process: the NATS URL."""
    from antdt.demo.run import wait_services
    from antdt.runtime.servers import EmbeddedCluster, ManagedProcess

    with EmbeddedCluster(root=out / "cluster") as cluster:
        argv = [sys.executable, "-m", "antdt.cli", "services", "--nats-url", cluster.nats.url]
        argv += ["--etcd-endpoint", cluster.etcd.endpoint]
        log_path = out / "services.log"
        services = ManagedProcess("antdt services", argv, log_path, env=dict(os.environ))
        services.spawn()
        try:
            wait_services(log_path, services)
            yield cluster.nats.url
        finally:
            services.stop()


def train(out: Path, nproc: int) -> dict[str, Any]:
    """The demo, then the FSDP2 example, under antdt launch against one control plane:
    the demo's figures and the example's wall time."""
    with control_plane(out) as nats_url:
        started = time.monotonic()
        code = _launch(out, nproc, nats_url)
        wall = time.monotonic() - started
        started = time.monotonic()
        fsdp2 = _fsdp2(out, nproc, nats_url) if code == 0 else None
        fsdp2_s = time.monotonic() - started
    if code != 0:
        raise RuntimeError(f"the training run failed (exit {code}); see {out}")
    if fsdp2 != 0:
        raise RuntimeError(f"the FSDP2 example failed (exit {fsdp2}); see {out}")
    progress = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    result = json.loads((out / "result.json").read_text())
    return {**figures(progress), **result, "ranks": nproc, "wall_s": wall, "fsdp2_s": fsdp2_s}


def _fsdp2(out: Path, nproc: int, nats_url: str) -> int:
    """examples/fsdp2/train.py (FSDP2, its reduce-scatter weighted by each rank's batch)
    under antdt launch, two epochs: its exit code."""
    script = [str(FSDP2_SCRIPT), "--out", str(out / "fsdp2-params.pt")]
    return _run_ranks(
        nproc,
        script,
        ANTDT_NATS__URL=nats_url,
        ANTDT_JOB=f"gpu-check-fsdp2-{int(time.time())}",
        ANTDT_DATASET_SIZE=str(FSDP2_DATASET),
        ANTDT_SHARD_SIZE="256",
        ANTDT_GLOBAL_BATCH=str(64 * nproc),
        ANTDT_EPOCHS="2",
    )


def _launch(out: Path, nproc: int, nats_url: str) -> int:
    return _run_ranks(
        nproc,
        ["-m", "antdt.demo.train"],
        ANTDT_NATS__URL=nats_url,
        ANTDT_JOB=f"gpu-check-{int(time.time())}",
        ANTDT_POLICY="lb-bsp",
        ANTDT_DATASET_SIZE=str(DATASET),
        ANTDT_SHARD_SIZE="512",
        ANTDT_GLOBAL_BATCH=str(GLOBAL_BATCH),
        ANTDT_EPOCHS=str(EPOCHS),
        ANTDT_SEED="7",
        ANTDT_DEMO_OUT=str(out),
        ANTDT_DEMO_DEVICE="auto",
    )


def _run_ranks(nproc: int, script: list[str], **settings: str) -> int:
    """`python SCRIPT...` as `nproc` ranks under antdt launch with `settings`, the backend
    left to the devices (nccl with a GPU per rank), quiet logs: the exit code."""
    env = {k: v for k, v in os.environ.items() if k != "ANTDT_BACKEND"}
    env.update(ANTDT_TELEMETRY__LOG_FORMAT="json", ANTDT_TELEMETRY__LOG_LEVEL="warning")
    env.update(settings)
    command = [sys.executable, "-m", "antdt.cli", "launch", "--nproc", str(nproc), "--"]
    command += [sys.executable, *script]
    try:
        return subprocess.run(command, env=env, timeout=TRAIN_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:  # the launcher's ranks die with it
        return 124


def print_figures(row: dict[str, Any]) -> None:
    table = Table(title="AntDT gpu-check: the demo on CUDA under antdt launch")
    table.add_column("what")
    table.add_column("value", justify="right")
    shown = [
        ("GPU", f"{row['gpu']} x{row['gpus']}"),
        ("torch / CUDA / NCCL", f"{row['torch']} / {row['cuda']} / {row['nccl']}"),
        ("ranks, backend, rank 0's device", f"{row['ranks']}, {row['backend']}, {row['device']}"),
        ("steps (global batch)", f"{row['steps']} ({GLOBAL_BATCH})"),
        ("steps/s", f"{row['steps_per_s']:,.1f}"),
        ("samples/s", f"{row['samples_per_s']:,.0f}"),
        ("step time mean / p50 / p95, ms", _ms(row)),
        ("test accuracy", f"{row['accuracy']:.3f}"),
        ("wall time of the run, s", f"{row['wall_s']:.1f}"),
        ("examples/fsdp2, 2 epochs, wall s", f"{row['fsdp2_s']:.1f}"),
    ]
    for what, value in shown:
        table.add_row(what, value)
    console.print(table)


def _ms(row: dict[str, Any]) -> str:
    return f"{row['step_ms_mean']:.2f} / {row['step_ms_p50']:.2f} / {row['step_ms_p95']:.2f}"


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("runs/gpu-check"))
    parser.add_argument("--nproc", type=int, default=0, help="ranks (default: GPUs, up to 8)")
    parser.add_argument("--skip-tests", action="store_true", help="only the training run")
    args = parser.parse_args(argv)
    torch = _torch()
    reason = no_cuda_reason(torch)
    if reason is not None:
        print(f"gpu-check: {reason}", file=sys.stderr)
        return 2
    if not args.skip_tests and (code := run_tests()) != 0:
        print(f"gpu-check: the gpu tests failed (pytest exit {code})", file=sys.stderr)
        return code
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    nproc = args.nproc or min(8, torch.cuda.device_count())
    try:
        row = {**machine(torch), **train(out, nproc)}
    except (RuntimeError, ValueError, OSError) as error:
        print(f"gpu-check: {error}", file=sys.stderr)
        return 1
    print_figures(row)
    (out / "results.json").write_text(json.dumps(row, indent=2))
    console.print(f"figures written to {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
