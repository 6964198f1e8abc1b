"""Stand-in ranks in their own process, for the latency bench: `python -m bench.ranks URL
PREFIX JOB WORLD REPORT`, until stdin closes. antdt.testing's FakeRanks, each on its own
connection; once every rank holds a plan version, `{"version", "first", "last"}` (when
it reached the first and the last rank) goes out on subject REPORT."""

from __future__ import annotations

import asyncio
import json
import sys

from antdt.runtime import loops
from antdt.runtime.config import NatsSettings
from antdt.testing import FakeRanks, acking_ranks


async def report_versions(ranks: FakeRanks, subject: str) -> None:
    """Publish each plan version once every rank holds it, until cancelled."""
    reported: set[int] = set()
    while True:
        ranks.changed.clear()
        for version in sorted(set(ranks.arrived) - reported):
            if ranks.everyone_has(version):
                times = ranks.arrived[version].values()
                report = {"version": version, "first": min(times), "last": max(times)}
                await ranks.bus.publish_raw(subject, json.dumps(report).encode())
                reported.add(version)
        await ranks.changed.wait()


async def _serve(url: str, prefix: str, job: str, world_size: int, report: str) -> None:
    nats = NatsSettings(url=url, subject_prefix=prefix)
    ranks = await acking_ranks(nats, job, world_size).start()
    reporter = asyncio.create_task(report_versions(ranks, report))
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until EOF
    reporter.cancel()
    await ranks.close()


def main() -> None:
    url, prefix, job, world_size, report = sys.argv[1:6]
    loops.run(_serve(url, prefix, job, int(world_size), report), "auto")


if __name__ == "__main__":
    main()
