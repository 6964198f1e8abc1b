"""A real OTLP/gRPC receiver in the test process: opentelemetry-proto's TraceService and
MetricsService on a loopback port, keeping what the exporters send (spans flattened with
their resource and scope; metric data points by name)."""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs if isinstance(kv, KeyValue)}


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    scope: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    kind: int
    start_ns: int
    end_ns: int
    status_code: int
    attributes: dict[str, Any]
    resource: dict[str, Any]


@dataclass
class _Sink:
    lock: threading.Lock = field(default_factory=threading.Lock)
    spans: list[ReceivedSpan] = field(default_factory=list)
    points: dict[str, list[tuple[dict[str, Any], float]]] = field(default_factory=dict)


class _Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: _Sink) -> None:
        self.sink = sink

    def Export(self, request: Any, context: Any) -> Any:
        received = []
        for rs in request.resource_spans:
            resource = _attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    received.append(
                        ReceivedSpan(
                            service=str(resource.get("service.name", "")),
                            scope=ss.scope.name,
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            status_code=s.status.code,
                            attributes=_attributes(s.attributes),
                            resource=resource,
                        )
                    )
        with self.sink.lock:
            self.sink.spans.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()


class _Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, sink: _Sink) -> None:
        self.sink = sink

    def Export(self, request: Any, context: Any) -> Any:
        with self.sink.lock:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        data = metric.WhichOneof("data")
                        for p in getattr(metric, data).data_points:
                            value = (
                                float(p.sum) if data == "histogram" else _number(p)
                            )  # histogram: the sum of the recorded values
                            row = (_attributes(p.attributes), value)
                            self.sink.points.setdefault(metric.name, []).append(row)
        return metrics_service_pb2.ExportMetricsServiceResponse()


def _number(p: Any) -> float:
    return float(p.as_int) if p.WhichOneof("value") == "as_int" else float(p.as_double)


class OtlpReceiver:
    """`endpoint` is `127.0.0.1:PORT` (OTLP/gRPC, plaintext); `address`, where it listens."""

    def __init__(self, address: str = "127.0.0.1:0") -> None:
        self._sink = _Sink()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Traces(self._sink), self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            _Metrics(self._sink), self._server
        )
        self.port = self._server.add_insecure_port(address)
        self.endpoint = f"127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=1).wait(5)

    def spans(self) -> list[ReceivedSpan]:
        with self._sink.lock:
            return list(self._sink.spans)

    def points(self, metric: str) -> list[tuple[dict[str, Any], float]]:
        with self._sink.lock:
            return list(self._sink.points.get(metric, []))
