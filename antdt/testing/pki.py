"""Certificates for TLS tests, made by the openssl command: a CA, a server certificate
for 127.0.0.1 and localhost, and a client certificate, all signed by that CA; and
certificates of that CA that expired a day before they were made."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(root: Path, name: str) -> None:
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-subj",
        f"/CN={name}",
        cwd=root,
    )


#: The SANs of the server and client certificates.
SERVER_SAN, CLIENT_SAN = "IP:127.0.0.1,DNS:localhost", "DNS:antdt-client"


def _signed(root: Path, ca: str, name: str, san: str, days: int = 2) -> None:
    _openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={name}",
        cwd=root,
    )
    (root / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.pem",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-days",
        str(days),  # negative: valid until before it was made, expired already
        "-out",
        f"{name}.pem",
        "-extfile",
        f"{name}.ext",
        cwd=root,
    )


def make_pki(root: Path, ca: str = "ca", server_names: tuple[str, ...] = ()) -> Pki:
    """A fresh CA named `ca` under `root` and the server and client certificates it signs;
    the server's for 127.0.0.1, localhost and the DNS `server_names` (containers')."""
    root.mkdir(parents=True, exist_ok=True)
    _ca(root, ca)
    names = ",".join(f"DNS:{n}" for n in ("localhost", *server_names))
    _signed(root, ca, f"{ca}-server", f"IP:127.0.0.1,{names}")
    _signed(root, ca, f"{ca}-client", CLIENT_SAN)
    return Pki(
        ca=root / f"{ca}.pem",
        server_cert=root / f"{ca}-server.pem",
        server_key=root / f"{ca}-server.key",
        client_cert=root / f"{ca}-client.pem",
        client_key=root / f"{ca}-client.key",
    )


def expired_certificate(pki: Pki, name: str, san: str = CLIENT_SAN) -> tuple[Path, Path]:
    """A certificate (and its key) named `name`, signed by `pki`'s CA, that expired a day
    before it was made: the CA trusts it, its dates do not."""
    root = pki.ca.parent
    _signed(root, pki.ca.stem, name, san, days=-1)
    return root / f"{name}.pem", root / f"{name}.key"
