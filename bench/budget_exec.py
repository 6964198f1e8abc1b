"""`python -m bench.budget_exec PREFIX COMMAND...`: join the cgroup `PREFIX-r<RANK>` (the
rank from torchrun's worker environment), then become COMMAND. The work-sharing bench
starts each rank through it, so the rank and its noisy neighbours share one CPU budget."""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: python -m bench.budget_exec PREFIX COMMAND...")
    prefix, command = argv[0], argv[1:]
    with open(f"{prefix}-r{os.environ['RANK']}/cgroup.procs", "w") as procs:
        procs.write("0")
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
