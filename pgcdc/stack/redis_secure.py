"""A second redis-server that only speaks TLS and only to an ACL user.

Started on demand (``scripts/stack up redis-secure``) beside the plaintext one. The plain
port is off (``port 0``), the ``default`` user is off, and the user ``cdc`` may run every
command on every key: what a managed Redis with ACLs and in-transit encryption looks like.
Client certificates are optional (``tls-auth-clients optional``), so mutual TLS can be tried.
"""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

from pgcdc.core.ports import HOST, SECURE_PORTS
from pgcdc.stack import common, credentials, tls
from pgcdc.stack.redis import Redis


class RedisSecure(Redis):
    name = "redis-secure"

    @property
    def port(self) -> int:
        return SECURE_PORTS[self.name]

    @property
    def conf(self) -> Path:
        return self.home / "redis.conf"

    def owns(self, cmdline: str) -> bool:
        # "redis-server <conf>" until Redis retitles itself "redis-server 127.0.0.1:<port>".
        return "redis-server" in cmdline and (
            str(self.conf) in cmdline or f":{self.port}" in cmdline
        )

    def prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.home.chmod(0o700)  # redis.conf holds the user's password
        pki = tls.ensure(self.paths)
        password = credentials.load(self.paths).redis_password
        self.conf.write_text(
            "\n".join(
                [
                    "# Written by scripts/stack on every start; edit pgcdc/stack/redis_secure.py.",
                    f"bind {HOST}",
                    "port 0",
                    f"tls-port {self.port}",
                    f"tls-cert-file {pki.server_cert}",
                    f"tls-key-file {pki.server_key}",
                    f"tls-ca-cert-file {pki.ca_cert}",
                    "tls-auth-clients optional",
                    f"dir {self.home}",
                    'save ""',
                    "appendonly no",
                    "daemonize no",
                    "protected-mode yes",
                    "user default off",
                    f"user {credentials.REDIS_USER} on >{password} ~* &* +@all",
                    "",
                ]
            )
        )
        self.conf.chmod(0o600)

    def launch(self) -> int:
        return common.spawn([self._exe(), self.conf], log=self.log, cwd=self.home)

    def probe(self) -> bool:
        """TLS with the stack's CA, AUTH as the ACL user, then PING."""
        pki = tls.pki(self.paths)
        if not pki.ca_cert.exists():
            return False
        password = credentials.load(self.paths).redis_password
        auth = _command("AUTH", credentials.REDIS_USER, password) + _command("PING")
        try:
            context = ssl.create_default_context(cafile=str(pki.ca_cert))
            with (
                socket.create_connection((HOST, self.port), timeout=2) as raw,
                context.wrap_socket(raw, server_hostname=HOST) as s,
            ):
                s.sendall(auth)
                answer = b""
                while answer.count(b"\r\n") < 2:
                    chunk = s.recv(64)
                    if not chunk:
                        return False
                    answer += chunk
                return answer == b"+OK\r\n+PONG\r\n"
        except (OSError, ssl.SSLError):
            return False


def _command(*words: str) -> bytes:
    """One command in RESP, the way redis-cli sends it."""
    out = f"*{len(words)}\r\n".encode()
    for w in words:
        b = w.encode()
        out += b"$%d\r\n%s\r\n" % (len(b), b)
    return out
