"""The restart-cost rows, tiny, against the test suite's servers: AntDT's KILL_RESTART
under antdt launch and torchrun, and torchrun's own restart after a kill -9."""

from __future__ import annotations

from pathlib import Path

from antdt.runtime.servers import EmbeddedCluster
from bench.restart_cost import TINY, bench_restart_cost, restart_rows, save_restart_chart


async def test_every_case_restarts_and_is_measured(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    got = await bench_restart_cost(cluster, TINY, tmp_path)
    assert list(got) == [
        "KILL_RESTART under antdt launch",
        "KILL_RESTART under torchrun",
        "kill -9 under torchrun",
    ]
    assert all(0 < seconds < 60 for seconds in got.values()), got
    rows = restart_rows(got)
    assert [r["baseline"] for r in rows] == [got["kill -9 under torchrun"] * 1000] * 2
    assert save_restart_chart(got, tmp_path / "restart.png").stat().st_size > 1000
