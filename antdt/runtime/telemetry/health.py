"""Liveness and readiness of a service process, served beside `/metrics`: `/livez` (the
event loop still turns) and `/readyz` (connected and its services started), for
orchestrators' probes (compose health checks, Nomad checks, Kubernetes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


class Readiness(str, Enum):
    """Where a service process stands.

    STARTING ──▶ READY ──▶ STOPPING
        │                     ▲
        └─────────────────────┘  (stopped before it was ready)

    STARTING covers the wait for NATS and etcd, for as long as it takes.
    """

    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"


_NEXT = {
    Readiness.STARTING: {Readiness.READY, Readiness.STOPPING},
    Readiness.READY: {Readiness.STOPPING},
    Readiness.STOPPING: set(),
}

#: The event loop is live while it has beaten within this many seconds.
LIVE_WITHIN_S = 10.0


@dataclass
class Health:
    """The process's readiness and the event loop's last heartbeat (monotonic seconds).
    Written by the loop, read by the HTTP server's threads (whole-value writes only)."""

    state: Readiness = Readiness.STARTING
    last_beat: float = field(default_factory=time.monotonic)

    def move(self, to: Readiness) -> None:
        """The one transition; a move the diagram does not have is a bug (ValueError)."""
        if to is not self.state and to not in _NEXT[self.state]:
            raise ValueError(f"readiness cannot go from {self.state.value} to {to.value}")
        self.state = to

    def beat(self, now: float) -> None:
        self.last_beat = now

    def live(self, now: float) -> bool:
        return now - self.last_beat <= LIVE_WITHIN_S


Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def health_app(health: Health, metrics: Wsgi, clock: Callable[[], float] = time.monotonic) -> Wsgi:
    """`/livez` and `/readyz` (200 or 503, the state in the body); anything else is
    `metrics`'s (Prometheus's app serves /metrics)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/livez":
            ok = health.live(clock())
            body = "live" if ok else "loop stuck"
        elif path == "/readyz":
            ok, body = health.state is Readiness.READY, health.state.value
        else:
            return metrics(environ, start_response)
        status = "200 OK" if ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [body.encode() + b"\n"]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # probes come every second
        pass


def serve(app: Wsgi, port: int, host: str) -> WSGIServer:
    """Serve `app` on `host:port` (0: a free port) from a daemon thread."""
    server = make_server(host, port, app, _Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="antdt-http", daemon=True).start()
    return server
