"""`python -m tests.chaos --seeds 1,2,3 --faults 40`: one soak per seed (the ranks under
torchrun on network-namespace hosts; `--local`: under antdt launch on this machine, no
link cut), each one's fault table, invariants and timeline picture (under --out); exit 1
when any invariant broke."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from antdt.testing.faults import table
from tests.chaos.soak import run_soak
from tests.chaos.timeline import draw


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated schedule seeds")
    parser.add_argument("--faults", type=int, default=40, help="faults per soak")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between faults")
    parser.add_argument("--out", type=Path, default=Path("runs/chaos"), help="pictures go here")
    parser.add_argument(
        "--local", action="store_true", help="ranks under antdt launch here, not on hosts"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = False
    for seed in [int(s) for s in args.seeds.split(",") if s.strip()]:
        root = args.out / f"run-seed{seed}"  # its servers' data and every process's log
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        soak = run_soak(seed, args.faults, root, every_s=args.every, hosts=not args.local)
        picture = draw(
            soak.steps, soak.records, args.out / f"chaos-seed{seed}.png", f"chaos soak, seed {seed}"
        )
        print(f"\n== seed {seed}: {len(soak.records)} faults, {soak.seconds:.0f} s, exit {soak.rc}")
        print(table(soak.records))
        print(f"actions recorded: {len(soak.actions)}; incidents: {len(soak.incidents)}")
        print("invariants: " + ("all kept" if not soak.problems else "BROKEN"))
        for problem in soak.problems:
            print(f"  - {problem}")
        print(f"timeline: {picture}")
        failed = failed or bool(soak.problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
