"""torch elastic's per-worker environment (what torchrun gives each rank), the one
contract the agent reads: `antdt launch` writes the same variables with the same
meanings, so a training script and the agent see no difference between the two."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: torchrun's default `--rdzv-id`: shared by every job that does not name one, so never
#: a job id.
UNNAMED_RUN = "none"


@dataclass(frozen=True)
class WorkerEnv:
    """One worker's place in an elastic run, as torch.distributed.run names it."""

    rank: int  # RANK: global rank
    local_rank: int  # LOCAL_RANK: rank on this node
    world_size: int  # WORLD_SIZE
    local_world_size: int  # LOCAL_WORLD_SIZE: workers on this node
    group_rank: int  # GROUP_RANK: this node's rank among the nodes
    group_world_size: int  # GROUP_WORLD_SIZE: nodes
    restart_count: int  # TORCHELASTIC_RESTART_COUNT: this node agent's group restarts so far
    max_restarts: int  # TORCHELASTIC_MAX_RESTARTS: the agent's restart budget
    run_id: str  # TORCHELASTIC_RUN_ID: the rendezvous id (a uuid under --standalone)
    master_addr: str  # MASTER_ADDR / MASTER_PORT: where the process group meets
    master_port: int
    role: str = "default"  # ROLE_NAME; ROLE_RANK and ROLE_WORLD_SIZE follow from it

    def variables(self) -> dict[str, str]:
        """The variables torchrun sets for this worker (one role: role = global ranks)."""
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.group_rank),
            "GROUP_WORLD_SIZE": str(self.group_world_size),
            "ROLE_NAME": self.role,
            "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "TORCHELASTIC_RESTART_COUNT": str(self.restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts),
            "TORCHELASTIC_RUN_ID": self.run_id,
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


#: Every variable of the contract; a launcher that sets them replaces all of them.
VARIABLES = tuple(WorkerEnv(0, 0, 1, 1, 0, 1, 0, 0, "", "", 0).variables())
#: AntDT overrides that would outrank the contract's values (settings read them first).
OVERRIDES = ("ANTDT_RANK", "ANTDT_WORLD_SIZE", "ANTDT_RESTART_COUNT", "ANTDT_LOCAL_RANK")


def worker_environ(base: Mapping[str, str], worker: WorkerEnv) -> dict[str, str]:
    """`base` with `worker`'s contract in place of any stale one (and of overrides)."""
    env = {k: v for k, v in base.items() if k not in OVERRIDES}
    env.update(worker.variables())
    return env


def run_id_as_job(run_id: str | None) -> str | None:
    """The rendezvous id when it names this run alone (not torchrun's default)."""
    if not run_id or run_id == UNNAMED_RUN:
        return None
    return run_id
