"""AntDT's OpenTelemetry metrics: every instrument is declared here; a service calls one
function per hook. Exported to Prometheus (`TelemetrySettings.metrics_port`: a /metrics
HTTP server) and/or by OTLP (`metrics_otlp_endpoint`); without either the instruments
are the API's no-ops.

| instrument | kind | unit | attributes | recorded by |
|---|---|---|---|---|
| `antdt.monitor.events.ingested` | observable counter | {event} | `antdt.replica` | monitor |
| `antdt.monitor.events.rejected` | observable counter | {event} | `antdt.replica`, `reason`, `messaging.destination.name` (bus) or `antdt.job` (detector) | monitor |
| `antdt.incidents` | counter | {transition} | `antdt.job`, `antdt.incident.kind`, `antdt.incident.class`, `antdt.incident.state` | monitor |
| `antdt.actions` | counter | {action} | `antdt.job`, `antdt.action.kind`, `antdt.action.result` | controller |
| `antdt.plan.latency` | histogram | s | `antdt.job`, `antdt.action.result` | controller: decision to the last ack |
| `antdt.job.balance_efficiency` | observable gauge | 1 | `antdt.job` | controller, latest JobHealth of owned jobs |
| `antdt.job.throughput` | observable gauge | {sample}/s | `antdt.job` | controller, latest JobHealth |

Prometheus names them with `_` for `.` and the unit (`antdt_incidents_total`,
`antdt_plan_latency_seconds_bucket`, `antdt_job_throughput_per_second`).
Hooks cost a dict update or a counter add per incident or action, nothing per step event:
the ingest and rejection counts are read from the monitor's own integers when scraped."""  # noqa: E501

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from antdt.schemas import ActionRecord, Incident, JobHealth

LATENCY_BUCKETS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
STALE_S = 30.0  # a job's gauges vanish this long after its last JobHealth here


class MonitorLike(Protocol):
    """What the ingest counters read (antdt.services.monitor.MonitorService)."""

    @property
    def settings(self) -> Any: ...  # .replica_id

    @property
    def ingested(self) -> int: ...

    @property
    def bus(self) -> Any: ...  # .rejections.counts: Counter[(subscription, code)]

    @property
    def detectors(self) -> Mapping[str, Any]: ...  # job -> .rejected: Counter[reason]


class _Instruments:
    def __init__(self) -> None:
        meter = metrics.get_meter("antdt")
        self.monitors: weakref.WeakSet[Any] = weakref.WeakSet()
        self.health: dict[str, tuple[float, float, float]] = {}  # job -> (t, eff, samples/s)
        self.lock = threading.Lock()
        self.incidents = meter.create_counter(
            "antdt.incidents", unit="{transition}", description="Incident transitions"
        )
        self.actions = meter.create_counter(
            "antdt.actions", unit="{action}", description="Actions recorded, by kind and result"
        )
        self.plan_latency = meter.create_histogram(
            "antdt.plan.latency", unit="s", description="From a decision to its last ack",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_S,
        )  # fmt: skip
        meter.create_observable_counter(
            "antdt.monitor.events.ingested", [self._ingested], unit="{event}",
            description="Step events fed to a detector",
        )  # fmt: skip
        meter.create_observable_counter(
            "antdt.monitor.events.rejected", [self._rejected], unit="{event}",
            description="Step events refused (bus validation) or ignored (detector)",
        )  # fmt: skip
        meter.create_observable_gauge(
            "antdt.job.balance_efficiency", [self._gauge(1)], unit="1",
            description="T_ideal / T_step of the job's latest JobHealth",
        )  # fmt: skip
        meter.create_observable_gauge(
            "antdt.job.throughput", [self._gauge(2)], unit="{sample}/s",
            description="Job throughput in its latest JobHealth",
        )  # fmt: skip

    def _live_monitors(self) -> list[Any]:
        with self.lock:
            return list(self.monitors)

    def _ingested(self, _: CallbackOptions) -> Iterable[Observation]:
        for m in self._live_monitors():
            yield Observation(m.ingested, {"antdt.replica": m.settings.replica_id})

    def _rejected(self, _: CallbackOptions) -> Iterable[Observation]:
        for m in self._live_monitors():
            replica = m.settings.replica_id
            with contextlib.suppress(RuntimeError):  # mutated by the service's loop meanwhile
                for (subscription, code), n in dict(m.bus.rejections.counts).items():
                    attrs = {"antdt.replica": replica, "reason": code}
                    yield Observation(n, {**attrs, "messaging.destination.name": subscription})
                for job, detector in dict(m.detectors).items():
                    for reason, n in dict(detector.rejected).items():
                        yield Observation(
                            n, {"antdt.replica": replica, "reason": reason, "antdt.job": job}
                        )

    def _gauge(self, field: int) -> Any:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            now = time.monotonic()
            with self.lock:
                for job, row in list(self.health.items()):
                    if now - row[0] > STALE_S:
                        del self.health[job]
                    else:
                        yield Observation(row[field], {"antdt.job": job})

        return observe


_instruments: _Instruments | None = None
_create = threading.Lock()


def _get() -> _Instruments:
    global _instruments
    if _instruments is None:
        with _create:
            if _instruments is None:
                _instruments = _Instruments()
    return _instruments


def watch_monitor(monitor: MonitorLike) -> None:
    """Count this monitor's ingested and rejected events (read when collected)."""
    instruments = _get()
    with instruments.lock:
        instruments.monitors.add(monitor)


def incident(inc: Incident) -> None:
    _get().incidents.add(
        1,
        {
            "antdt.job": inc.job,
            "antdt.incident.kind": inc.kind.value,
            "antdt.incident.class": inc.straggler_class.value,
            "antdt.incident.state": inc.state.value,
        },
    )


def action(record: ActionRecord) -> None:
    instruments = _get()
    attrs = {"antdt.job": record.job, "antdt.action.result": record.result.value}
    instruments.actions.add(1, {**attrs, "antdt.action.kind": record.kind})
    instruments.plan_latency.record(max(0.0, record.completed_at - record.decided_at), attrs)


def job_health(health: JobHealth) -> None:
    instruments = _get()
    with instruments.lock:
        instruments.health[health.job] = (
            time.monotonic(),
            health.balance_efficiency,
            health.samples_per_s,
        )
