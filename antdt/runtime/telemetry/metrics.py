"""AntDT's OpenTelemetry metrics: every instrument is declared here, and a service calls one
function per hook (the instruments: docs/observability.md, "Metrics"). Hooks cost a dict
update or a counter add per incident or action, nothing per step event: counts are read
from the services' own integers when scraped."""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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

    @property
    def intake(self) -> Any: ...  # .backlog: (events, bytes) waiting


class ShardsLike(Protocol):
    """What the shards instruments read (antdt.services.shards.ShardsService)."""

    @property
    def settings(self) -> Any: ...  # .replica_id

    @property
    def bus(self) -> Any: ...  # .rejections.counts: Counter[(subscription, code)]

    def counters(self) -> Mapping[str, float]:
        """SHARDS_COUNTERS' keys, and `requests.{verb}` for each verb served."""

    def owned_ledgers(self) -> Iterable[LedgerFigures]:
        """The stored ledgers of the jobs this replica owns, as last written or read."""


@dataclass(frozen=True)
class LedgerFigures:
    """One job's data ledger, as the shards gauges show it."""

    job: str
    epoch: int
    incarnation: int
    done: int  # shards of the current epoch
    todo: int
    in_flight: int


#: instrument -> (counter key, unit, description) of the shards counters.
SHARDS_COUNTERS = {
    "antdt.shards.commits": ("commits", "{transaction}", "Ledger transactions that succeeded"),
    "antdt.shards.operations.committed": (
        "committed",
        "{operation}",
        "Ledger operations made durable",
    ),
    "antdt.shards.operations.early": (
        "early",
        "{operation}",
        "Fetches answered before their write (write-behind)",
    ),
    "antdt.shards.conflicts": (
        "conflicts",
        "{conflict}",
        "Ledger compare-and-swaps that failed: another replica wrote",
    ),
    "antdt.shards.store.duration": ("store_s", "s", "Time spent in ledger transactions"),
    "antdt.shards.written": ("written_bytes", "By", "Bytes the ledger transactions wrote to etcd"),
    "antdt.shards.budget_waits": (
        "budget_waits",
        "{write}",
        "Ledger writes held back by the job's write budget",
    ),
}


class _Instruments:
    def __init__(self) -> None:
        meter = metrics.get_meter("antdt")
        self.monitors: weakref.WeakSet[Any] = weakref.WeakSet()
        self.shards: weakref.WeakSet[Any] = weakref.WeakSet()
        self.health: dict[str, tuple[float, float, float]] = {}  # job -> (t, eff, samples/s)
        self.lock = threading.Lock()
        self.incidents = meter.create_counter(
            "antdt.incidents", unit="{transition}", description="Incident transitions"
        )
        self.actions = meter.create_counter(
            "antdt.actions", unit="{action}", description="Actions recorded, by kind and result"
        )
        self.deferred = meter.create_counter(
            "antdt.decisions.deferred",
            unit="{transition}",
            description="Incident transitions left to the job's next health decision: the "
            "job's decisions had taken their share of the controller's core",
        )
        self.stored_rejected = meter.create_counter(
            "antdt.store.values.rejected",
            unit="{value}",
            description="Values read from etcd that were not their key's type, by type",
        )
        self.plan_latency = meter.create_histogram(
            "antdt.plan.latency",
            unit="s",
            description="From a decision to its last ack",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_S,
        )
        meter.create_observable_counter(
            "antdt.monitor.events.ingested",
            [self._ingested],
            unit="{event}",
            description="Step events fed to a detector",
        )
        meter.create_observable_counter(
            "antdt.monitor.events.rejected",
            [self._rejected],
            unit="{event}",
            description="Step events refused (bus validation) or ignored (detector)",
        )
        meter.create_observable_gauge(
            "antdt.monitor.backlog",
            [self._backlog],
            unit="By",
            description="Step events waiting to be handled, every owned job's together",
        )
        meter.create_observable_gauge(
            "antdt.job.balance_efficiency",
            [self._gauge(1)],
            unit="1",
            description="T_ideal / T_step of the job's latest JobHealth",
        )
        meter.create_observable_gauge(
            "antdt.job.throughput",
            [self._gauge(2)],
            unit="{sample}/s",
            description="Job throughput in its latest JobHealth",
        )

        self._shards_instruments(meter)

    def _shards_instruments(self, meter: metrics.Meter) -> None:
        meter.create_observable_counter(
            "antdt.shards.requests",
            [self._shards_requests],
            unit="{request}",
            description="Shards requests that passed validation, by verb (one the ledger refuses "
            "counts here and in antdt.shards.requests.refused)",
        )
        meter.create_observable_counter(
            "antdt.shards.requests.refused",
            [self._shards_refused],
            unit="{request}",
            description="Shards requests answered with an ErrorReply, by code",
        )
        for name, (key, unit, description) in SHARDS_COUNTERS.items():
            meter.create_observable_counter(
                name, [self._shards_counter(key)], unit=unit, description=description
            )
        meter.create_observable_gauge(
            "antdt.shards.ledger.shards",
            [self._ledgers(_by_state)],
            unit="{shard}",
            description="Shards of the current epoch done, to do and in flight",
        )
        meter.create_observable_gauge(
            "antdt.shards.ledger.epoch",
            [self._ledgers(lambda f: [(f.epoch, {})])],
            unit="{epoch}",
            description="The epoch the job's ledger is at",
        )
        meter.create_observable_gauge(
            "antdt.shards.ledger.incarnation",
            [self._ledgers(lambda f: [(f.incarnation, {})])],
            unit="{restart}",
            description="Restores of the job's ledger (0: first run)",
        )

    def _live(self, services: weakref.WeakSet[Any]) -> list[Any]:
        with self.lock:
            return list(services)

    def _live_monitors(self) -> list[Any]:
        return self._live(self.monitors)

    def _shards_requests(self, _: CallbackOptions) -> Iterable[Observation]:
        for s in self._live(self.shards):
            replica = s.settings.replica_id
            for key, n in s.counters().items():
                if key.startswith("requests."):
                    verb = key.removeprefix("requests.")
                    yield Observation(n, {"antdt.replica": replica, "antdt.shards.verb": verb})

    def _shards_refused(self, _: CallbackOptions) -> Iterable[Observation]:
        for s in self._live(self.shards):
            yield from _refusals(s.settings.replica_id, s.bus.rejections.counts)

    def _shards_counter(self, key: str) -> Any:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            for s in self._live(self.shards):
                yield Observation(s.counters()[key], {"antdt.replica": s.settings.replica_id})

        return observe

    def _ledgers(self, values: Any) -> Any:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            for s in self._live(self.shards):
                for figures in s.owned_ledgers():
                    for value, attrs in values(figures):
                        yield Observation(value, {"antdt.job": figures.job, **attrs})

        return observe

    def _ingested(self, _: CallbackOptions) -> Iterable[Observation]:
        for m in self._live_monitors():
            yield Observation(m.ingested, {"antdt.replica": m.settings.replica_id})

    def _backlog(self, _: CallbackOptions) -> Iterable[Observation]:
        for m in self._live_monitors():
            with contextlib.suppress(RuntimeError):  # mutated by the service's loop meanwhile
                yield Observation(m.intake.backlog[1], {"antdt.replica": m.settings.replica_id})

    def _rejected(self, _: CallbackOptions) -> Iterable[Observation]:
        for m in self._live_monitors():
            replica = m.settings.replica_id
            yield from _refusals(replica, m.bus.rejections.counts)
            with contextlib.suppress(RuntimeError):  # mutated by the service's loop meanwhile
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


def _refusals(replica: str, counts: Mapping[tuple[str, str], int]) -> Iterable[Observation]:
    """A bus's rejection counts, by reason and subscription."""
    rows: list[tuple[tuple[str, str], int]] = []
    with contextlib.suppress(RuntimeError):  # mutated by the service's loop meanwhile
        rows = list(dict(counts).items())
    for (subscription, code), n in rows:
        attrs = {"antdt.replica": replica, "reason": code}
        yield Observation(n, {**attrs, "messaging.destination.name": subscription})


def _by_state(figures: LedgerFigures) -> list[tuple[int, dict[str, str]]]:
    counts = (("done", figures.done), ("todo", figures.todo), ("in_flight", figures.in_flight))
    return [(n, {"antdt.shards.state": state}) for state, n in counts]


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


def watch_shards(service: ShardsLike) -> None:
    """Serve this shards replica's counters and its owned jobs' ledgers (read when
    collected)."""
    instruments = _get()
    with instruments.lock:
        instruments.shards.add(service)


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


def decision_deferred(job: str) -> None:
    _get().deferred.add(1, {"antdt.job": job})


def stored_value_rejected(kind: str) -> None:
    _get().stored_rejected.add(1, {"antdt.store.value": kind})


def job_health(health: JobHealth) -> None:
    instruments = _get()
    with instruments.lock:
        instruments.health[health.job] = (
            time.monotonic(),
            health.balance_efficiency,
            health.samples_per_s,
        )
