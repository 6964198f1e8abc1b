"""The options several `antdt` commands share, each defined once."""

from __future__ import annotations

from typing import Annotated

import typer

NatsOpt = Annotated[str | None, typer.Option("--nats-url", help="NATS URL (else ANTDT_NATS__URL)")]
EtcdOpt = Annotated[
    str | None, typer.Option("--etcd-endpoint", help="etcd host:port (else ANTDT_ETCD__ENDPOINT)")
]
MetricsOpt = Annotated[
    int | None,
    typer.Option(
        "--metrics-port", help="Serve Prometheus /metrics here (else ANTDT_TELEMETRY__METRICS_PORT)"
    ),
]
JobOpt = Annotated[str, typer.Option("--job", help="Job id")]
