"""The rules the client security settings follow (Kafka, Redis, OpenSearch).

The fields are declared in :mod:`pgcdc.core.settings`; their checks live here so that a
mistake (credentials set but a plaintext protocol, half of a key pair) stops the start with
one line instead of being silently ignored by a client.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Protocol
from urllib.parse import urlsplit

from pydantic import SecretStr


class SecurityProtocol(StrEnum):
    """librdkafka's and Kafka's ``security.protocol``."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"


class SaslMechanism(StrEnum):
    """``sasl.mechanism``: PLAIN and SCRAM log in with ``sasl_username``/``sasl_password``;
    GSSAPI and OAUTHBEARER take their properties from ``kafka.client``/``kafka.spark_client``."""

    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"
    GSSAPI = "GSSAPI"
    OAUTHBEARER = "OAUTHBEARER"


SASL_PROTOCOLS = (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)
TLS_PROTOCOLS = (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)
PASSWORD_MECHANISMS = (
    SaslMechanism.PLAIN,
    SaslMechanism.SCRAM_SHA_256,
    SaslMechanism.SCRAM_SHA_512,
)

# Client properties that have a setting of their own (secrets stay SecretStr, and one place
# sets each): kafka.client and kafka.spark_client may not set them.
KAFKA_DEDICATED_PROPERTIES = {
    "bootstrap.servers": "bootstrap_servers",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
    "ssl.ca.location": "ssl_ca_location",
    "ssl.certificate.location": "ssl_certificate_location",
    "ssl.key.location": "ssl_key_location",
    "ssl.key.password": "ssl_key_password",
}


class _TlsFiles(Protocol):
    @property
    def ssl_certificate_location(self) -> str | None: ...
    @property
    def ssl_key_location(self) -> str | None: ...


class _KafkaSecurity(_TlsFiles, Protocol):
    """What :func:`check_kafka` reads of ``KafkaSettings`` (settings imports this module)."""

    @property
    def security_protocol(self) -> SecurityProtocol: ...
    @property
    def sasl_mechanism(self) -> SaslMechanism | None: ...
    @property
    def sasl_username(self) -> str | None: ...
    @property
    def sasl_password(self) -> SecretStr | None: ...
    @property
    def ssl_ca_location(self) -> str | None: ...


class _RedisTls(_TlsFiles, Protocol):
    @property
    def url(self) -> SecretStr: ...
    @property
    def ssl_ca_location(self) -> str | None: ...


class _SearchAuth(_TlsFiles, Protocol):
    @property
    def username(self) -> str | None: ...
    @property
    def password(self) -> SecretStr | None: ...


def check_not_dedicated(properties: Iterable[str]) -> None:
    """A pass-through may not set what a dedicated setting sets."""
    for key in properties:
        if key in KAFKA_DEDICATED_PROPERTIES:
            raise ValueError(f"{key} has its own setting: kafka.{KAFKA_DEDICATED_PROPERTIES[key]}")


def check_kafka(k: _KafkaSecurity) -> None:
    """SASL settings need a SASL protocol and vice versa; TLS files need a TLS protocol;
    a client certificate comes with its key."""
    protocol = f"kafka.security_protocol is {k.security_protocol.value}"
    if k.security_protocol not in SASL_PROTOCOLS and (
        k.sasl_mechanism or k.sasl_username or k.sasl_password
    ):
        raise ValueError(f"SASL settings are set but {protocol}; use SASL_SSL")
    if k.security_protocol in SASL_PROTOCOLS and k.sasl_mechanism is None:
        choices = ", ".join(m.value for m in SaslMechanism)
        raise ValueError(f"{protocol}: set kafka.sasl_mechanism ({choices})")
    if k.sasl_mechanism in PASSWORD_MECHANISMS and not (k.sasl_username and k.sasl_password):
        raise ValueError(
            f"sasl_mechanism {k.sasl_mechanism}: set kafka.sasl_username and kafka.sasl_password"
        )
    tls_files = (k.ssl_ca_location, k.ssl_certificate_location, k.ssl_key_location)
    if k.security_protocol not in TLS_PROTOCOLS and any(tls_files):
        raise ValueError(f"TLS files are set but {protocol}; use SSL or SASL_SSL")
    if bool(k.ssl_certificate_location) != bool(k.ssl_key_location):
        raise ValueError(
            "mutual TLS needs both kafka.ssl_certificate_location and kafka.ssl_key_location"
        )


def check_redis(r: _RedisTls) -> None:
    """TLS files only make sense with a ``rediss://`` URL; a certificate needs its key."""
    tls_files = (r.ssl_ca_location, r.ssl_certificate_location, r.ssl_key_location)
    if any(tls_files) and urlsplit(r.url.get_secret_value()).scheme != "rediss":
        raise ValueError("TLS files are set but redis.url is not rediss://")
    if bool(r.ssl_certificate_location) != bool(r.ssl_key_location):
        raise ValueError(
            "mutual TLS needs both redis.ssl_certificate_location and redis.ssl_key_location"
        )


def check_search(s: _SearchAuth) -> None:
    """Basic auth is a pair; a client certificate needs its key."""
    if bool(s.username) != bool(s.password):
        raise ValueError("basic auth needs both search.username and search.password")
    if bool(s.ssl_certificate_location) != bool(s.ssl_key_location):
        raise ValueError(
            "mutual TLS needs both search.ssl_certificate_location and search.ssl_key_location"
        )
