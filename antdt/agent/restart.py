"""KILL_RESTART on the rank's side (pure, but for the file the launcher reads): whether
a rank can honour it, and the hosts to avoid left for the launcher, which restarts the
group when its ranks exit with RESTART_EXIT_CODE."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from antdt.schemas import KillRestart

#: The exit code of a rank that checkpointed for a requested restart (EX_TEMPFAIL);
#: `antdt launch` restarts the group on it (torchrun restarts on any failure).
RESTART_EXIT_CODE = 75
#: The exit code of a torchrun (`--rdzv-backend=antdt`) whose node may not join the job:
#: its host is blocklisted (a KILL_RESTART moved a rank off it) or another live torchrun
#: holds its host name. The launcher must not start it again on this host.
BLOCKED_EXIT_CODE = 76


@dataclass(frozen=True)
class RestartRequest:
    action_id: str
    step: int
    avoid_hosts: tuple[str, ...]
    rank: int


def judge(cmd: KillRestart, next_step: int, world_size: int) -> str | None:
    """Why this rank cannot honour the command (None: it can)."""
    if cmd.rank >= world_size:
        return f"kill_restart names rank {cmd.rank} outside a job of {world_size}"
    if cmd.checkpoint_step < next_step:
        return f"checkpoint step {cmd.checkpoint_step} has passed (next step {next_step})"
    return None


def write_request(folder: str | None, rank: int, request: RestartRequest) -> Path | None:
    """Leave the hosts to avoid where the launcher looks (ANTDT_LAUNCH_DIR)."""
    if not folder:
        return None
    path = Path(folder) / f"restart-{rank}.json"
    tmp = path.with_suffix(".tmp")
    fields = {
        "action_id": request.action_id,
        "step": request.step,
        "avoid_hosts": list(request.avoid_hosts),
    }
    tmp.write_text(json.dumps(fields))
    os.replace(tmp, path)
    return path
