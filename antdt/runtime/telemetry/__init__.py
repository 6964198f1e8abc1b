"""Telemetry: OpenTelemetry tracing set-up and the incident trace, metrics, and
structlog logging."""

from antdt.runtime.telemetry.health import Health, Readiness
from antdt.runtime.telemetry.setup import (
    MetricsExport,
    flush_tracing,
    setup_metrics,
    setup_tracing,
)

__all__ = [
    "Health",
    "MetricsExport",
    "Readiness",
    "flush_tracing",
    "setup_metrics",
    "setup_tracing",
]
