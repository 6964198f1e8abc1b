"""OpenTelemetry setup: a tracer provider per process, OTLP export when an endpoint is
configured (grpc `host:port`, or an http(s) URL for OTLP/HTTP), and a clean flush."""

from __future__ import annotations

import contextlib

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter


def _otlp_exporter(endpoint: str) -> SpanExporter:
    if endpoint.startswith(("http://", "https://")) and endpoint.rstrip("/").endswith("/v1/traces"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

        return Http(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

    return Grpc(endpoint=endpoint.split("://", 1)[-1], insecure=True)


def setup_tracing(service_name: str, otlp_endpoint: str | None) -> TracerProvider:
    """Install a tracer provider for this process (once). Without an endpoint spans are
    still created (ids for logs and headers) but not exported."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if otlp_endpoint:
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(otlp_endpoint)))
    with contextlib.suppress(Exception):
        trace.set_tracer_provider(provider)
    return provider


def flush_tracing(provider: TracerProvider | None, timeout_s: float = 5.0) -> None:
    if provider is None:
        return
    with contextlib.suppress(Exception):
        provider.force_flush(int(timeout_s * 1000))
        provider.shutdown()
