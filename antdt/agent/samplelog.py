"""Reading the agent's sample log (ANTDT_SAMPLE_LOG): which sample ids reached the final
model, per epoch, across restarts. Lines: `{"incarnation", "epoch", "step", "ids"}` per
synced step, `{"incarnation", "restored": S}` per restore; a restore to S undoes the
steps after S of earlier incarnations."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any


def read_sample_logs(prefix: str | Path, world_size: int) -> list[dict[str, Any]]:
    """Every rank's lines, in file order per rank; a missing file counts as empty."""
    lines: list[dict[str, Any]] = []
    for rank in range(world_size):
        path = Path(f"{prefix}.rank{rank}.jsonl")
        if path.exists():
            for text in path.read_text(encoding="utf-8").splitlines():
                if text.strip():
                    lines.append({**json.loads(text), "rank": rank})
    return lines


def surviving_steps(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step lines whose updates are in the final model: a line of incarnation i at
    step t survives when every later incarnation restored to a step >= t."""
    restores: dict[int, int] = {}  # incarnation -> restored step (-1: from the start)
    for line in lines:
        if "restored" in line:
            step = line["restored"]
            restores[line["incarnation"]] = -1 if step is None else step
    survivors = []
    for line in lines:
        if "ids" not in line:
            continue
        later = [s for k, s in restores.items() if k > line.get("incarnation", 0)]
        if all(line["step"] <= s for s in later):
            survivors.append(line)
    return survivors


def ids_per_epoch(lines: list[dict[str, Any]]) -> dict[int, Counter[int]]:
    """How often each sample id reached the final model, per epoch."""
    out: dict[int, Counter[int]] = {}
    for line in surviving_steps(lines):
        out.setdefault(line["epoch"], Counter()).update(line["ids"])
    return out


def exactly_once_problems(lines: list[dict[str, Any]], dataset_size: int, epochs: int) -> list[str]:
    """What breaks "every sample of every epoch reached the model exactly once"; empty
    when nothing does."""
    problems = []
    counts = ids_per_epoch(lines)
    expected = set(range(dataset_size))
    for epoch in range(epochs):
        seen = counts.get(epoch, Counter())
        missing = len(expected - set(seen))
        repeated = sum(1 for n in seen.values() if n > 1)
        foreign = len(set(seen) - expected)
        if missing or repeated or foreign:
            problems.append(
                f"epoch {epoch}: {missing} missing, {repeated} repeated, {foreign} unknown ids"
            )
    extra = sorted(set(counts) - set(range(epochs)))
    if extra:
        problems.append(f"ids logged for epochs {extra} beyond the job's {epochs}")
    return problems
