"""The bench's helper processes: `python -m bench.<module>` on this Python, with the
repository root on their path (the bench is not installed, and a test may run it from
another directory)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

#: The repository's root: where `bench` and the DLRover environment are.
ROOT = Path(__file__).resolve().parents[1]


async def start_module(module: str, *args: str, **options: Any) -> asyncio.subprocess.Process:
    """Start `python -m bench.<module> ARGS...`; `options` as create_subprocess_exec's."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**options.pop("env", os.environ), "PYTHONPATH": path}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", f"bench.{module}", *args, env=env, **options
    )
