"""The commands that run a job on this machine: its ranks (`launch`) and the demo."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

#: `launch` passes what follows `--` to the ranks, unknown options included.
LAUNCH_CONTEXT: dict[str, Any] = {"allow_extra_args": True, "ignore_unknown_options": True}


def launch(
    ctx: typer.Context,
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="Ranks to start")] = 2,
    max_restarts: Annotated[
        int, typer.Option("--max-restarts", min=0, help="Group restarts after a rank fails")
    ] = 0,
    spare_slots: Annotated[
        int, typer.Option("--spare-slots", min=0, help="Spare host slots for KILL_RESTART")
    ] = 0,
    cores: Annotated[
        str,
        typer.Option("--cores", help="Pin rank r to the r-th of these cores, e.g. 0,1 or 0-3,8"),
    ] = "",
) -> None:
    """Start N local ranks: `antdt launch --nproc 4 -- python train.py` (their
    init_process_group: gloo on CPU, nccl where each rank has a GPU, or ANTDT_BACKEND).
    With --max-restarts, a failed group is started again (TORCHELASTIC_RESTART_COUNT=k) to
    resume from its checkpoint. Each rank gets the environment torchrun would give it."""
    from antdt.agent.launch import launch as run_ranks

    command = [a for a in ctx.args if a != "--"]
    if not command:
        raise typer.BadParameter("give the command after --, e.g. -- python train.py")
    pinned = core_list(cores)
    code = run_ranks(
        nproc,
        command,
        env=dict(os.environ),
        max_restarts=max_restarts,
        spare_slots=spare_slots,
        cores=pinned,
    )
    raise typer.Exit(code)


def core_list(cores: str) -> list[int]:
    """The cores of a cpuset list (`0,1`, `0-3,8`), in order; a usage error otherwise."""
    found: list[int] = []
    for part in (p.strip() for p in cores.split(",")):
        first, dash, last = part.partition("-")
        if not part:
            continue
        if not _number(first) or (dash and not _number(last)):
            raise typer.BadParameter(f"--cores: {part!r} is not a core or a range like 0-3")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise typer.BadParameter(f"--cores: {part!r} runs backwards")
        if high - low >= MAX_CORES:
            raise typer.BadParameter(f"--cores: {part!r} names more than {MAX_CORES} cores")
        found += range(low, high + 1)
    return found


#: The most cores one range of --cores may name.
MAX_CORES = 65_536


def _number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def demo(
    out: Annotated[Path, typer.Option(help="Where results go")] = Path("runs/demo"),
    steps: Annotated[int, typer.Option(help="Training steps per run")] = 150,
) -> None:
    """Train a real model twice (policy none, then lb-bsp) with a 3x-slow rank, and show
    what AntDT did."""
    from antdt.demo.run import run_demo

    raise typer.Exit(run_demo(out, steps=steps))
