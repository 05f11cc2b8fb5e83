"""Certificates for a throwaway TLS node: a CA of its own and a server certificate
for 127.0.0.1 and localhost, made with the ``openssl`` command (tests of amqps://)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


class CertificateError(Exception):
    """openssl is missing or failed."""


@dataclass(frozen=True)
class ServerCertificates:
    """A CA's certificate and a server's certificate and key that it signed."""

    ca: Path
    certificate: Path
    key: Path


def make_ca(directory: Path, name: str = "ca") -> tuple[Path, Path]:
    """A self-signed CA in ``directory``: its certificate and key."""
    certificate, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", f"/CN=broker-jobs test {name}", "-keyout", key, "-out", certificate,
    )  # fmt: skip
    return certificate, key


def make_server_certificates(directory: Path) -> ServerCertificates:
    """A CA, and a server certificate it signed for 127.0.0.1 and localhost."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = make_ca(directory)
    key, request = directory / "server.key", directory / "server.csr"
    certificate, extensions = directory / "server.pem", directory / "server.ext"
    extensions.write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", key, "-out", request,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
        "-days", "2", "-extfile", extensions, "-out", certificate,
    )  # fmt: skip
    key.chmod(0o644)  # the node runs as rabbitmq when we are root
    return ServerCertificates(ca, certificate, key)


def _openssl(*arguments: object) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise CertificateError("openssl is not installed (apt-get install openssl)")
    done = subprocess.run(
        [openssl, *map(str, arguments)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise CertificateError(f"openssl {arguments[0]} failed: {done.stderr.strip()}")
