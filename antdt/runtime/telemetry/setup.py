"""OpenTelemetry setup: a tracer provider per process, OTLP export when an endpoint is
configured (the settings and the `OTEL_*` variables honoured: docs/observability.md),
and a clean flush."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import structlog
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from antdt.runtime.telemetry.health import Health, health_app, serve

log = structlog.get_logger("antdt.telemetry")


def _protocol(signal: str) -> str:
    return (
        os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    )


def otlp_exporter(endpoint: str, signal: str = "traces", timeout_s: float | None = None) -> Any:
    """The OTLP exporter for `signal` ('traces' or 'metrics') at `endpoint`. `timeout_s`
    bounds an export with its retries unless OTEL_EXPORTER_OTLP_[SIGNAL_]TIMEOUT is set."""
    path = f"/v1/{signal}"
    env_timeout = f"OTEL_EXPORTER_OTLP_{signal.upper()}_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"
    kw: dict[str, Any] = {}
    if timeout_s is not None and not any(os.environ.get(n) for n in env_timeout):
        kw["timeout"] = timeout_s
    http = _protocol(signal.upper()).startswith("http") or endpoint.rstrip("/").endswith(path)
    if http:
        url = endpoint if "://" in endpoint else f"http://{endpoint}"
        url = url if url.rstrip("/").endswith(path) else url.rstrip("/") + path
        if signal == "traces":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            return OTLPSpanExporter(endpoint=url, **kw)
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(endpoint=url, **kw)
    secure = endpoint.startswith("https://")
    target = endpoint.split("://", 1)[-1]
    if signal == "traces":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcSpans,
        )

        return GrpcSpans(endpoint=target, insecure=not secure, **kw)
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
        OTLPMetricExporter as GrpcMetrics,
    )

    return GrpcMetrics(endpoint=target, insecure=not secure, **kw)


def resource(service_name: str, extra: Mapping[str, str | int] | None = None) -> Resource:
    """`service.name` unless OTEL_SERVICE_NAME names one; OTEL_RESOURCE_ATTRIBUTES merged."""
    attributes: dict[str, str | int] = dict(extra or {})
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = service_name
    return Resource.create(attributes)


def setup_tracing(
    service_name: str,
    otlp_endpoint: str | None,
    *,
    install: bool = True,
    attributes: Mapping[str, str | int] | None = None,
    export_timeout_s: float | None = None,
) -> TracerProvider:
    """A tracer provider for this process, installed as the global one (once; a provider
    already installed, e.g. the application's, stays) unless `install` is False. Without
    an endpoint spans are still created (ids for logs and headers) but not exported."""
    provider = TracerProvider(resource=resource(service_name, attributes))
    if otlp_endpoint:
        exporter: SpanExporter | None = None
        try:
            exporter = otlp_exporter(otlp_endpoint, timeout_s=export_timeout_s)
        except ImportError as exc:  # the agent's image may lack the exporter package
            log.warning("no OTLP exporter: spans not exported", error=str(exc))
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
    if install:
        with contextlib.suppress(Exception):
            trace.set_tracer_provider(provider)
    return provider


class MetricsExport:
    """The process's meter provider and, with a port, its Prometheus /metrics server."""

    def __init__(self, provider: Any, server: Any = None) -> None:
        self.provider = provider
        self.server = server
        self.port: int | None = server.server_address[1] if server is not None else None

    def flush(self, timeout_s: float = 5.0) -> None:
        with contextlib.suppress(Exception):
            self.provider.force_flush(int(timeout_s * 1000))
        with contextlib.suppress(Exception):
            self.provider.shutdown(int(timeout_s * 1000))
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.shutdown()
                self.server.server_close()


def setup_metrics(
    service_name: str,
    *,
    port: int | None = None,
    host: str = "0.0.0.0",
    otlp_endpoint: str | None = None,
    interval_s: float = 15.0,
    install: bool = True,
    health: Health | None = None,
) -> MetricsExport | None:
    """A meter provider exporting to Prometheus (an HTTP /metrics server on `port`; 0
    picks a free one; with `health`, /livez and /readyz beside it) and/or by OTLP to
    `otlp_endpoint`; None when neither is asked for (the instruments stay no-ops).
    Installed as the global one unless `install` is False."""
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader

    readers: list[MetricReader] = []
    server = None
    if port is not None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import make_wsgi_app

        readers.append(PrometheusMetricReader())
        app = make_wsgi_app()
        server = serve(health_app(health, app) if health is not None else app, port, host)
    if otlp_endpoint:
        readers.append(
            PeriodicExportingMetricReader(
                otlp_exporter(otlp_endpoint, "metrics"),
                export_interval_millis=interval_s * 1000,
            )
        )
    if not readers:
        return None
    provider = MeterProvider(resource=resource(service_name), metric_readers=readers)
    if install:
        with contextlib.suppress(Exception):
            metrics.set_meter_provider(provider)
    return MetricsExport(provider, server)


def flush_tracing(provider: TracerProvider | None, timeout_s: float = 5.0) -> None:
    if provider is None:
        return
    with contextlib.suppress(Exception):
        provider.force_flush(int(timeout_s * 1000))
        provider.shutdown()
