"""The stack's secured endpoints answer as a company's servers would, beside the plaintext ones:
PostgreSQL with TLS (verify-full against the stack's CA), Kafka with SASL_SSL (SCRAM-SHA-512),
Redis with TLS and an ACL user."""

from __future__ import annotations

import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from pgcdc.core.ports import HOST, KAFKA_BOOTSTRAP, POSTGRES_DSN, REDIS_URL
from tests.conftest import Endpoints

pytestmark = pytest.mark.integration


def _kafka_conf(env: dict[str, str], **over: str) -> dict[str, str]:
    return {
        "bootstrap.servers": env["CDC_KAFKA__BOOTSTRAP_SERVERS"],
        "security.protocol": env["CDC_KAFKA__SECURITY_PROTOCOL"],
        "sasl.mechanism": env["CDC_KAFKA__SASL_MECHANISM"],
        "sasl.username": env["CDC_KAFKA__SASL_USERNAME"],
        "sasl.password": env["CDC_KAFKA__SASL_PASSWORD"],
        "ssl.ca.location": env["CDC_KAFKA__SSL_CA_LOCATION"],
        "log_level": "0",  # the refusals below are expected; keep librdkafka quiet
    } | over


def _ssl_of(dsn: str) -> bool:
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        row = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
    assert row is not None
    return bool(row[0])


def _other_ca(tmp_path: Path) -> Path:
    """A CA that signed nothing the stack serves."""
    key, crt = tmp_path / "other.key", tmp_path / "other.crt"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes"),
            *("-keyout", key, "-out", crt, "-days", "1", "-subj", "/CN=someone else"),
        ],
        check=True,
        capture_output=True,
    )
    return crt


def test_postgres_verify_full_over_tls_and_plaintext_beside_it(
    secure_env: dict[str, str], endpoints: Endpoints, tmp_path: Path
) -> None:
    dsn = secure_env["CDC_POSTGRES__DSN"]
    assert "sslmode=verify-full" in dsn
    assert _ssl_of(dsn) is True
    # The name in the certificate is checked: localhost is in it too.
    assert _ssl_of(dsn.replace(f"@{HOST}:", "@localhost:")) is True
    # Another CA is refused: verify-full really verifies.
    ca = urlsplit(dsn).query.split("sslrootcert=")[1]
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        _ssl_of(dsn.replace(ca, str(_other_ca(tmp_path))))
    # The plaintext DSN every other test uses still works.
    assert endpoints.postgres_dsn == POSTGRES_DSN
    assert _ssl_of(f"{POSTGRES_DSN}?sslmode=disable") is False


def test_kafka_sasl_ssl_logs_in_and_refuses_a_wrong_password(secure_env: dict[str, str]) -> None:
    md = AdminClient(_kafka_conf(secure_env)).list_topics(timeout=30)
    assert [b.port for b in md.brokers.values()] == [
        int(secure_env["CDC_KAFKA__BOOTSTRAP_SERVERS"].rsplit(":", 1)[1])
    ]
    wrong = AdminClient(_kafka_conf(secure_env, **{"sasl.password": "not-the-password"}))
    with pytest.raises(KafkaException):
        wrong.list_topics(timeout=5)
    # Without TLS the listener does not talk at all.
    plain = AdminClient(_kafka_conf(secure_env, **{"security.protocol": "SASL_PLAINTEXT"}))
    with pytest.raises(KafkaException):
        plain.list_topics(timeout=5)
    # The plaintext broker beside it is untouched.
    assert AdminClient({"bootstrap.servers": KAFKA_BOOTSTRAP}).list_topics(timeout=30).brokers


def test_redis_acl_user_over_tls_only(secure_env: dict[str, str], tmp_path: Path) -> None:
    url, ca = secure_env["CDC_REDIS__URL"], secure_env["CDC_REDIS__SSL_CA_LOCATION"]
    parts = urlsplit(url)
    assert parts.scheme == "rediss" and parts.username == "cdc"
    r = redis.Redis.from_url(url, ssl_ca_certs=ca, socket_timeout=10)
    assert r.acl_whoami() in ("cdc", b"cdc")
    assert r.set("security-test", "1") and r.delete("security-test") == 1
    # The default user is off: no password means no access, even over TLS.
    anonymous = redis.Redis(host=HOST, port=parts.port, ssl=True, ssl_ca_certs=ca)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(url.replace(f":{parts.password}@", ":wrong@"), ssl_ca_certs=ca).ping()
    # Plaintext is not served on the TLS port, and another CA is not trusted.
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(url.replace("rediss://", "redis://"), socket_timeout=3).ping()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(url, ssl_ca_certs=str(_other_ca(tmp_path))).ping()
    # The plaintext Redis beside it is untouched.
    assert redis.Redis.from_url(REDIS_URL).ping()
