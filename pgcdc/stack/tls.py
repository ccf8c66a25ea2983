"""A local certificate authority and the certificates the secured servers present.

Made once with ``openssl`` under ``.stack/tls/`` and kept across ``down``/``up``:

- ``ca.crt`` / ``ca.key``: the stack's own CA; clients trust ``ca.crt`` (``sslrootcert``,
  ``ssl.ca.location``, ``ssl_ca_certs``).
- ``server.crt`` / ``server.key``: every server's certificate, for ``localhost`` and
  ``127.0.0.1`` (as an IP and as a DNS name, so both IP-aware and name-only hostname checks
  pass: libpq's ``verify-full``, Java's HTTPS identification, librdkafka's ``https``).
- ``server.p12``: the same key and chain as a PKCS12 keystore for Kafka (JDK 17 reads it).
- ``client.crt`` / ``client.key``: a client certificate (CN ``cdc``) for mutual TLS.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from pgcdc.stack import common

DAYS_CA = 3650
DAYS_LEAF = 825  # the longest validity some clients accept for a leaf certificate
SERVER_NAMES = "DNS:localhost,DNS:127.0.0.1,IP:127.0.0.1"


@dataclass(frozen=True)
class Pki:
    """Paths of the stack's CA and certificates."""

    folder: Path

    @property
    def ca_cert(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.folder / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.folder / "server.key"

    @property
    def client_cert(self) -> Path:
        return self.folder / "client.crt"

    @property
    def client_key(self) -> Path:
        return self.folder / "client.key"

    @property
    def keystore(self) -> Path:
        return self.folder / "server.p12"

    @property
    def keystore_password_file(self) -> Path:
        return self.folder / "server.p12.pass"

    def keystore_password(self) -> str:
        return self.keystore_password_file.read_text().strip()

    def complete(self) -> bool:
        return all(
            p.exists()
            for p in (
                self.ca_cert,
                self.server_cert,
                self.server_key,
                self.client_cert,
                self.client_key,
                self.keystore,
                self.keystore_password_file,
            )
        )


def pki(paths: common.Paths) -> Pki:
    """Where the stack's certificates live (they may not exist yet: see :func:`ensure`)."""
    return Pki(paths.stack / "tls")


def ensure(paths: common.Paths) -> Pki:
    """Create the CA and the certificates unless they all exist; return their paths."""
    p = pki(paths)
    if p.complete():
        return p
    p.folder.mkdir(parents=True, exist_ok=True)
    p.folder.chmod(0o755)  # servers running as other users read the certificates
    common.say(f"creating a local CA and certificates in {p.folder} (openssl)")
    if not (p.ca_cert.exists() and p.ca_key.exists()):
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            p.ca_key,
            "-out",
            p.ca_cert,
            "-days",
            str(DAYS_CA),
            "-subj",
            "/CN=pgcdc local stack CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        )
    _leaf(
        p, "server", "/CN=localhost", f"subjectAltName={SERVER_NAMES}\nextendedKeyUsage=serverAuth"
    )
    _leaf(p, "client", "/CN=cdc", "extendedKeyUsage=clientAuth")
    password = secrets.token_urlsafe(18)
    _openssl(
        "pkcs12",
        "-export",
        "-in",
        p.server_cert,
        "-inkey",
        p.server_key,
        "-certfile",
        p.ca_cert,
        "-name",
        "server",
        "-out",
        p.keystore,
        "-passout",
        "env:STACK_P12_PASS",
        env={"STACK_P12_PASS": password},
    )
    p.keystore_password_file.write_text(password + "\n")
    for private in (p.ca_key, p.server_key, p.client_key, p.keystore, p.keystore_password_file):
        private.chmod(0o600)
    return p


def _leaf(p: Pki, name: str, subject: str, extensions: str) -> None:
    """A key and a certificate signed by the CA, with ``extensions`` (openssl extfile lines)."""
    key, cert = p.folder / f"{name}.key", p.folder / f"{name}.crt"
    csr, ext = p.folder / f"{name}.csr", p.folder / f"{name}.ext"
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        + extensions
        + "\n"
    )
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", subject)
    _openssl(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        p.ca_cert,
        "-CAkey",
        p.ca_key,
        "-CAcreateserial",
        "-out",
        cert,
        "-days",
        str(DAYS_LEAF),
        "-extfile",
        ext,
    )
    csr.unlink()
    ext.unlink()


def _openssl(*args: str | Path, env: dict[str, str] | None = None) -> None:
    common.run(["openssl", *args], env=env, timeout=60)
