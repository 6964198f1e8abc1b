"""What a first connection to nats-server needs: its servers, which of them answer, the
client's TLS, and the refusals that retrying will not cure (credentials, certificates),
in words that name the setting."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from antdt.runtime.bus.messages import BusError
from antdt.runtime.config import NatsSettings, TlsSettings


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
    """nats-py's connect options for `settings`: endless reconnects, the user and its
    inbox prefix, TLS."""
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
        "max_reconnect_attempts": -1,
        "allow_reconnect": True,
        "pending_size": settings.max_pending_bytes,
    }


def client_tls(tls: TlsSettings) -> ssl.SSLContext | None:
    """The SSL context of a client with `tls` (None: plaintext); BusError for a file
    that cannot be read."""
    if not tls.enabled:
        return None
    try:
        context = ssl.create_default_context(cafile=str(tls.ca))
        if tls.cert is not None:
            context.load_cert_chain(str(tls.cert), str(tls.key))
    except (OSError, ssl.SSLError) as exc:
        raise BusError(f"NATS TLS files: {exc}") from None
    return context


def connect_refusal(exc: BaseException) -> str | None:
    """Why the server will never take this client as it is (credentials, certificates),
    in words; None for an error that may pass (a server not up yet, a lost link)."""
    text = str(exc)
    if "authorization violation" in text.lower():
        return "authorization violation: wrong user or password (ANTDT_NATS__USER/PASSWORD)"
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
