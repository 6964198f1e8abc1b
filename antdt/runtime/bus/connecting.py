"""A Bus's first connection to nats-server: tries with backoff until a server answers
(for as long as it takes, if asked), the client's user and TLS, and the refusals that
retrying will not cure (credentials, certificates), in words that name the setting."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from nats.aio.client import Client as NatsClient

from antdt.runtime.backoff import Backoff
from antdt.runtime.bus.messages import BusError
from antdt.runtime.config import NatsSettings, TlsSettings

log = structlog.get_logger("antdt.bus")

#: How long one try at a first connection may take when trying for as long as it takes.
ATTEMPT_S = 10.0
ErrorCallback = Callable[[Exception], Awaitable[None]]


async def first_connection(
    settings: NatsSettings,
    name: str,
    retry_for_s: float | None,
    *,
    error_cb: ErrorCallback,
    **callbacks: Callable[[], Awaitable[None]],
) -> NatsClient:
    """A connected nats-py client (see `Bus.connect`); BusError when it gives up or the
    server refuses. `error_cb` gets every error but the refusals of a first try."""
    loop, url = asyncio.get_running_loop(), settings.url
    started, attempt = loop.time(), 0
    backoff = Backoff(settings.reconnect_wait_s, settings.backoff_max_s, retry_for_s)
    tls = client_tls(settings.tls)
    while not backoff.gives_up(waited := loop.time() - started):
        attempt += 1
        budget = ATTEMPT_S if retry_for_s is None else retry_for_s - waited
        # nats-py retries an unreachable first server forever (reconnects are on) and
        # may swallow a cancel while doing so: only call it once a server answers TCP.
        if await any_server_reachable(servers(url), min(budget, 1.0)):
            options = {**connect_options(settings, name, tls), **callbacks}
            nc = await _try(options, budget, error_cb)
            if nc is not None:
                if attempt > 1:
                    log.info("nats ready", url=url, client=name, waited_s=round(waited, 1))
                return nc
        delay = backoff.delay(attempt)
        if retry_for_s is None and backoff.worth_reporting(attempt):
            log.info("waiting for nats", url=url, client=name, attempt=attempt, next_in_s=delay)
        await asyncio.sleep(min(delay, max(budget, 0)))
    raise BusError(f"cannot connect to NATS at {url} in {retry_for_s}s")


async def _try(
    options: dict[str, Any],
    timeout: float,
    error_cb: ErrorCallback,
) -> NatsClient | None:
    """One try, bounded with asyncio.wait (which returns even if nats-py lingers)."""
    nc, refusal = NatsClient(), asyncio.get_running_loop().create_future()

    async def on_error(exc: Exception) -> None:
        reason = connect_refusal(exc) if not nc.is_connected else None
        if reason is not None and not refusal.done():
            refusal.set_result(reason)
        elif reason is None:
            await error_cb(exc)

    task = asyncio.ensure_future(nc.connect(**options, error_cb=on_error))
    waits: set[asyncio.Future[Any]] = {task, refusal}
    done, _ = await asyncio.wait(waits, timeout=timeout, return_when="FIRST_COMPLETED")
    if task in done and task.exception() is None:
        return nc
    if task not in done:
        task.cancel()
    if refusal in done:
        with contextlib.suppress(Exception):
            await nc.close()
        where = f"{','.join(options['servers'])} as {options['name']!r}"
        raise BusError(f"cannot connect to NATS at {where}: {refusal.result()}")
    return None


def servers(url: str) -> list[str]:
    """The server URLs of a comma-separated `url`."""
    return [u.strip() for u in url.split(",") if u.strip()]


async def any_server_reachable(urls: list[str], timeout: float) -> bool:
    """Does any of `urls` take a TCP connection within `timeout` seconds?"""
    for url in urls:
        host_port = url.split("://", 1)[-1].rsplit("@", 1)[-1]
        host, _, port = host_port.rpartition(":")
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host or "127.0.0.1", int(port or 4222)), timeout
            )
        except (OSError, TimeoutError, asyncio.TimeoutError, ValueError):
            continue
        writer.close()
        return True
    return False


def connect_options(
    settings: NatsSettings, name: str, tls: ssl.SSLContext | None
) -> dict[str, Any]:
    """nats-py's connect options for `settings`: endless reconnects, a dead server noticed
    by pings, the user and its inbox prefix, TLS."""
    password = settings.password
    return {
        "servers": servers(settings.url),
        "name": name,
        "user": settings.user,
        "password": password.get_secret_value() if password is not None else None,
        "inbox_prefix": settings.inbox_prefix,
        "tls": tls,
        "connect_timeout": settings.connect_timeout_s,
        "reconnect_time_wait": settings.reconnect_wait_s,
        "ping_interval": settings.ping_interval_s,
        "max_outstanding_pings": settings.max_outstanding_pings,
        "max_reconnect_attempts": -1,
        "allow_reconnect": True,
        "pending_size": settings.max_pending_bytes,
    }


def client_tls(tls: TlsSettings) -> ssl.SSLContext | None:
    """The SSL context of a client with `tls` (None: plaintext); BusError for a file
    that cannot be read."""
    if not tls.enabled:
        return None
    expired = tls.expired_cert(time.time())
    if expired:
        raise BusError(f"NATS TLS: {expired}: renew it (ANTDT_NATS__TLS__CERT)")
    try:
        context = ssl.create_default_context(cafile=str(tls.ca))
        if tls.cert is not None:
            context.load_cert_chain(str(tls.cert), str(tls.key))
    except (OSError, ssl.SSLError) as exc:
        raise BusError(f"NATS TLS files: {exc}") from None
    return context


#: OpenSSL's X509_V_ERR_CERT_HAS_EXPIRED.
CERT_HAS_EXPIRED = 10


def connect_refusal(exc: BaseException) -> str | None:
    """Why the server will never take this client as it is (credentials, certificates),
    in words; None for an error that may pass (a server not up yet, a lost link)."""
    text = str(exc)
    if "authorization violation" in text.lower():
        return "authorization violation: wrong user or password (ANTDT_NATS__USER/PASSWORD)"
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_code == CERT_HAS_EXPIRED:
        return f"the server's TLS certificate has expired ({exc.verify_message}): renew it"
    if "alert certificate expired" in text.lower():
        return "it found the client certificate expired: renew it (ANTDT_NATS__TLS__CERT)"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"its TLS certificate is not trusted ({exc.verify_message}): "
            "set the CA that signed it (ANTDT_NATS__TLS__CA)"
        )
    if "certificate required" in text.lower():
        return "it requires a client certificate (ANTDT_NATS__TLS__CERT and __KEY)"
    if isinstance(exc, ssl.SSLError) or "tls" in text.lower():
        return f"TLS failed: {text or type(exc).__name__} (ANTDT_NATS__TLS__*)"
    return None


def permissions_violation(exc: BaseException) -> bool:
    """Is `exc` nats-server's refusal of a publish or subscription outside the user's
    permissions (the connection stays open)?"""
    return "permissions violation" in str(exc).lower()
