"""The options several `antdt` commands share, each defined once."""

from __future__ import annotations

import re
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
#: What the wire takes as a job id (schemas.base.Token): 1-128 of A-Z a-z 0-9 _ -.
JOB_ID = re.compile(r"[A-Za-z0-9_\-]{1,128}")


def job_id(value: str) -> str:
    """A job id the wire takes, else a usage error (exit 2) saying what one is: never a
    subject wildcard, a dot or a space sent to NATS."""
    if not JOB_ID.fullmatch(value):
        raise typer.BadParameter(f"{value!r}: 1-128 letters, digits, '_' or '-'")
    return value


JobOpt = Annotated[str, typer.Option("--job", help="Job id", callback=job_id)]
