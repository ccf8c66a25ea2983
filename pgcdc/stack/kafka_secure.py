"""A second Kafka broker whose only client listener is SASL_SSL (SCRAM-SHA-512 over TLS).

Started on demand (``scripts/stack up kafka-secure``) beside the plaintext broker, which keeps
running untouched: adding a listener to that one would need a restart under every test.
Its own KRaft cluster, storage and controller port; the broker's certificate comes from the
stack's CA (:mod:`pgcdc.stack.tls`). Two SCRAM users: ``admin``, made with the storage (the
broker logs in as it), and ``cdc``, made afterwards with ``kafka-configs``
(``kafka.admin.ConfigCommand``) like an operator would.
"""

from __future__ import annotations

import hashlib
import socket
import ssl
import struct
from pathlib import Path

from pgcdc.core.ports import HOST, KAFKA_SECURE_CONTROLLER_PORT, SECURE_PORTS
from pgcdc.stack import common, credentials, tls
from pgcdc.stack.kafka import Kafka, request

MECHANISM = "SCRAM-SHA-512"
SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"


def jaas(username: str, password: str) -> str:
    """A ``sasl.jaas.config`` value for a SCRAM login."""
    return f'{SCRAM_LOGIN} required username="{username}" password="{password}";'


class KafkaSecure(Kafka):
    name = "kafka-secure"

    @property
    def port(self) -> int:
        return SECURE_PORTS[self.name]

    @property
    def controller_port(self) -> int:
        return KAFKA_SECURE_CONTROLLER_PORT

    @property
    def admin_config(self) -> Path:
        """Client properties of the admin user, for the Kafka command-line tools."""
        return self.home / "admin.properties"

    @property
    def _users_stamp(self) -> Path:
        return self.home / "users.done"

    def prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.home.chmod(0o700)  # server.properties holds the keystore and admin passwords
        if not (self.data / "meta.properties").exists():
            self._users_stamp.unlink(missing_ok=True)
        pki = tls.ensure(self.paths)
        creds = credentials.load(self.paths)
        self.admin_config.write_text(
            "\n".join(
                [
                    "security.protocol=SASL_SSL",
                    f"sasl.mechanism={MECHANISM}",
                    f"sasl.jaas.config={jaas(credentials.KAFKA_ADMIN, creds.kafka_admin_password)}",
                    "ssl.truststore.type=PEM",
                    f"ssl.truststore.location={pki.ca_cert}",
                    "",
                ]
            )
        )
        super().prepare()

    def format_arguments(self) -> list[str]:
        password = credentials.load(self.paths).kafka_admin_password
        return ["--add-scram", f"{MECHANISM}=[name={credentials.KAFKA_ADMIN},password={password}]"]

    def listener_properties(self) -> list[str]:
        pki = tls.ensure(self.paths)
        creds = credentials.load(self.paths)
        controller = f"{HOST}:{self.controller_port}"
        listener = "listener.name.sasl_ssl"
        return [
            f"listeners=SASL_SSL://{self.address},CONTROLLER://{controller}",
            f"advertised.listeners=SASL_SSL://{self.address}",
            # The controller listener stays plaintext on 127.0.0.1: only this broker uses it.
            "listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=SASL_SSL",
            f"sasl.enabled.mechanisms={MECHANISM}",
            f"sasl.mechanism.inter.broker.protocol={MECHANISM}",
            f"{listener}.{MECHANISM.lower()}.sasl.jaas.config="
            + jaas(credentials.KAFKA_ADMIN, creds.kafka_admin_password),
            "ssl.keystore.type=PKCS12",
            f"ssl.keystore.location={pki.keystore}",
            f"ssl.keystore.password={pki.keystore_password()}",
            f"ssl.key.password={pki.keystore_password()}",
            # The broker checks its own keystore with a client engine: that one trusts the CA.
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={pki.ca_cert}",
            "ssl.client.auth=none",
        ]

    def after_ready(self) -> None:
        """Create (or update) the SCRAM user the clients log in as, once per password."""
        creds = credentials.load(self.paths)
        stamp = hashlib.sha256(
            f"{credentials.KAFKA_USER}\0{creds.kafka_password}".encode()
        ).hexdigest()
        if self._users_stamp.exists() and self._users_stamp.read_text().strip() == stamp:
            return
        common.say(f"kafka-secure: creating SCRAM user {credentials.KAFKA_USER} (kafka-configs)")
        proc = common.run(
            [
                *self._java(),
                "kafka.admin.ConfigCommand",
                "--bootstrap-server",
                self.address,
                "--command-config",
                self.admin_config,
                "--alter",
                "--entity-type",
                "users",
                "--entity-name",
                credentials.KAFKA_USER,
                "--add-config",
                f"{MECHANISM}=[iterations=8192,password={creds.kafka_password}]",
            ],
            timeout=120,
            check=False,
        )
        if proc.returncode != 0:
            # Not common.run's message: that one quotes the command, password included.
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            raise common.StackError(
                f"kafka-secure: kafka-configs could not create the user: {tail}"
            )
        self._users_stamp.write_text(stamp + "\n")

    def probe(self) -> bool:
        return probe_kafka_tls(HOST, self.port, tls.pki(self.paths).ca_cert)


def probe_kafka_tls(host: str, port: int, cafile: Path, timeout: float = 3) -> bool:
    """A TLS handshake that verifies the broker's certificate, then ApiVersions (which Kafka
    answers before SASL authentication) with error 0."""
    if not cafile.exists():
        return False
    try:
        context = ssl.create_default_context(cafile=str(cafile))
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host) as s,
        ):
            s.settimeout(timeout)
            api = request(s, 18, 0, 1, b"")
            return bool(struct.unpack(">h", api[:2])[0] == 0)
    except (OSError, ssl.SSLError, struct.error):
        return False
