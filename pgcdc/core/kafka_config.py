"""One Kafka client configuration, built from the ``kafka`` settings for every client.

:func:`client_config` gives librdkafka's properties (the reader's producer, admin and
consumers, the state store, ``cdc status``, the jobs' dead-letter producer);
:func:`spark_source_options` gives the Spark Kafka source's ``kafka.*`` options with the
same meaning for Kafka's Java client: SASL as a JAAS login, the CA as a PEM truststore.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pgcdc.core.client_security import PASSWORD_MECHANISMS, SaslMechanism
from pgcdc.core.errors import ConfigError

if TYPE_CHECKING:
    from pgcdc.core.settings import KafkaSettings

# Java's JAAS login module for each mechanism that logs in with a user name and password.
_LOGIN_MODULES = {
    SaslMechanism.PLAIN: "org.apache.kafka.common.security.plain.PlainLoginModule",
    SaslMechanism.SCRAM_SHA_256: "org.apache.kafka.common.security.scram.ScramLoginModule",
    SaslMechanism.SCRAM_SHA_512: "org.apache.kafka.common.security.scram.ScramLoginModule",
}

# Words that mark a pass-through property as secret (sasl.jaas.config holds a password,
# ssl.key.pem a private key, sasl.oauthbearer.client.secret a secret).
_SECRET_WORDS = ("password", "secret", "jaas", "key.pem", "keystore.key", "token")


def _existing(setting: str, path: str | None) -> str | None:
    """The path, if set, after checking the file is there (librdkafka's own error for a
    missing file is an OpenSSL code, not a sentence)."""
    if path is not None and not Path(path).is_file():
        raise ConfigError(f"kafka.{setting} {path} is not a readable file")
    return path


def client_config(kafka: KafkaSettings) -> dict[str, str]:
    """librdkafka properties every client starts from: brokers, security, pass-through.

    Callers add what their role needs (``group.id``, ``acks``, a logger) on top.
    """
    conf = {
        "bootstrap.servers": kafka.bootstrap_servers,
        "security.protocol": kafka.security_protocol.value,
    }
    if kafka.sasl_mechanism is not None:
        conf["sasl.mechanism"] = kafka.sasl_mechanism.value
    if kafka.sasl_username is not None:
        conf["sasl.username"] = kafka.sasl_username
    if kafka.sasl_password is not None:
        conf["sasl.password"] = kafka.sasl_password.get_secret_value()
    files = {
        "ssl.ca.location": _existing("ssl_ca_location", kafka.ssl_ca_location),
        "ssl.certificate.location": _existing(
            "ssl_certificate_location", kafka.ssl_certificate_location
        ),
        "ssl.key.location": _existing("ssl_key_location", kafka.ssl_key_location),
    }
    conf |= {k: v for k, v in files.items() if v is not None}
    if kafka.ssl_key_password is not None:
        conf["ssl.key.password"] = kafka.ssl_key_password.get_secret_value()
    return conf | dict(kafka.client)


def _jaas_quoted(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def _jaas(module: str, username: str, password: str) -> str:
    user, secret = _jaas_quoted(username), _jaas_quoted(password)
    return f'{module} required username="{user}" password="{secret}";'


def spark_source_options(kafka: KafkaSettings) -> dict[str, str]:
    """The Spark Kafka source's ``kafka.*`` options for the same brokers and credentials.

    Spark's Kafka client is Java: the SASL user becomes ``sasl.jaas.config``, the CA file a
    PEM truststore, a client certificate and key a PEM keystore given inline (so executors
    need no copy of them). ``kafka.spark_client`` is merged last, for what has no mapping
    (GSSAPI and OAUTHBEARER logins, a JKS truststore).
    """
    opts = {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "kafka.security.protocol": kafka.security_protocol.value,
    }
    mechanism = kafka.sasl_mechanism
    if mechanism is not None:
        opts["kafka.sasl.mechanism"] = mechanism.value
    if mechanism in PASSWORD_MECHANISMS:
        # The settings' checks guarantee both for these mechanisms.
        assert kafka.sasl_username is not None and kafka.sasl_password is not None
        opts["kafka.sasl.jaas.config"] = _jaas(
            _LOGIN_MODULES[mechanism],
            kafka.sasl_username,
            kafka.sasl_password.get_secret_value(),
        )
    elif mechanism is not None and "sasl.jaas.config" not in kafka.spark_client:
        raise ConfigError(
            f"kafka.sasl_mechanism {mechanism.value} has no automatic mapping to the Spark "
            'Kafka source: set kafka.spark_client = {"sasl.jaas.config": "..."} (and what '
            "else the Java client needs for it)"
        )
    ca = _existing("ssl_ca_location", kafka.ssl_ca_location)
    if ca is not None:
        opts["kafka.ssl.truststore.type"] = "PEM"
        opts["kafka.ssl.truststore.location"] = ca
    cert = _existing("ssl_certificate_location", kafka.ssl_certificate_location)
    key = _existing("ssl_key_location", kafka.ssl_key_location)
    if cert is not None and key is not None:
        opts["kafka.ssl.keystore.type"] = "PEM"
        opts["kafka.ssl.keystore.certificate.chain"] = Path(cert).read_text()
        opts["kafka.ssl.keystore.key"] = Path(key).read_text()
        if kafka.ssl_key_password is not None:
            opts["kafka.ssl.key.password"] = kafka.ssl_key_password.get_secret_value()
    if kafka.exactly_once:
        # Java consumers read uncommitted records by default; a transactional reader's
        # records count once their Kafka transaction commits.
        opts["kafka.isolation.level"] = "read_committed"
    return opts | {f"kafka.{k}": v for k, v in kafka.spark_client.items()}


def secret_values(kafka: KafkaSettings) -> list[str]:
    """Every secret the Kafka settings hold, as it could appear in text (for scrubbing)."""
    out = [s.get_secret_value() for s in (kafka.sasl_password, kafka.ssl_key_password) if s]
    for props in (kafka.producer, kafka.client, kafka.spark_client):
        out += [v for k, v in props.items() if any(w in k.lower() for w in _SECRET_WORDS)]
    if kafka.sasl_password is not None:
        # The password as the JAAS line of spark_source_options spells it.
        out.append(_jaas_quoted(kafka.sasl_password.get_secret_value()))
    return sorted({s for s in out if s})
