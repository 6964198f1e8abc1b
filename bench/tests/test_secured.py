"""The auth + TLS rows, short: the same cycles and ingest really served on secured
servers (users per role, TLS to NATS and etcd) as on plaintext ones started alike."""

from __future__ import annotations

import pytest

from antdt.runtime.servers import EmbeddedCluster
from bench.secured_rows import SHORT, secured_rows

pytestmark = pytest.mark.integration


async def test_the_secured_rows_measure_both_modes_without_loss(cluster: EmbeddedCluster) -> None:
    ingest, cycles = await secured_rows(cluster, SHORT)
    for row in (ingest, cycles):
        assert row["value"] > 0 and row["baseline"] > 0, row
        assert row["target"].startswith("ratio >= 0.8")
        assert row["ratio"] == row["value"] / row["baseline"]  # one round: its own ratio
    [ingested], [served_both] = ingest["details"], cycles["details"]
    for mode in ("secured", "plaintext"):
        assert ingested[mode]["lost"] == 0, ingested
        assert ingested[mode]["jobs_lost"] == 0
        served = served_both[mode]
        assert served["cycles_per_s"] > 10 and served["service_cpu_us_per_cycle"] > 0, served
        assert served["cas_conflicts"] == 0
    assert cycles["cpu_ratio"] > 0
