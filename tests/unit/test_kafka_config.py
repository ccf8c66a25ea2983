"""One Kafka client configuration: librdkafka properties for every Python client and the
same brokers and credentials as the Spark Kafka source's options; client TLS and auth for
Redis and OpenSearch; every mistake one clear line, no secret ever printed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pgcdc.core.errors import ConfigError
from pgcdc.core.follower_clients import opensearch_options, redis_options
from pgcdc.core.kafka_config import client_config, secret_values, spark_source_options
from pgcdc.core.settings import SaslMechanism, SecurityProtocol, Settings, load_settings

pytestmark = pytest.mark.unit

PASSWORD = 's3cr3t-"quoted"-\\back'
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("CDC_"):
            monkeypatch.delenv(k)


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, str]:
    """Stand-ins for the PEM files (only their existence and content matter here)."""
    files = {}
    for name, text in (
        ("ca", "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n"),
        ("cert", "-----BEGIN CERTIFICATE-----\nME\n-----END CERTIFICATE-----\n"),
        ("key", "-----BEGIN PRIVATE KEY-----\nKEY\n-----END PRIVATE KEY-----\n"),
    ):
        (tmp_path / f"{name}.pem").write_text(text)
        files[name] = str(tmp_path / f"{name}.pem")
    return files


def _sasl_ssl_env(monkeypatch: pytest.MonkeyPatch, ca: str) -> None:
    for k, v in {
        "CDC_KAFKA__BOOTSTRAP_SERVERS": "b1:9093,b2:9093",
        "CDC_KAFKA__SECURITY_PROTOCOL": "sasl_ssl",  # librdkafka takes either case
        "CDC_KAFKA__SASL_MECHANISM": "scram-sha-512",
        "CDC_KAFKA__SASL_USERNAME": "cdc",
        "CDC_KAFKA__SASL_PASSWORD": PASSWORD,
        "CDC_KAFKA__SSL_CA_LOCATION": ca,
    }.items():
        monkeypatch.setenv(k, v)


def test_defaults_are_plaintext_to_the_local_broker() -> None:
    k = load_settings().kafka
    assert client_config(k) == {
        "bootstrap.servers": "127.0.0.1:19092",
        "security.protocol": "PLAINTEXT",
    }
    assert spark_source_options(k) == {
        "kafka.bootstrap.servers": "127.0.0.1:19092",
        "kafka.security.protocol": "PLAINTEXT",
    }
    assert secret_values(k) == []


def test_a_transactional_reader_s_records_are_read_committed_by_spark() -> None:
    """Java consumers read uncommitted records unless told (docs/exactly-once.md)."""
    k = load_settings(overrides={"kafka": {"exactly_once": True}}).kafka
    assert spark_source_options(k)["kafka.isolation.level"] == "read_committed"
    assert "kafka.isolation.level" not in spark_source_options(load_settings().kafka)


def test_sasl_ssl_scram_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, pem: dict[str, str]
) -> None:
    _sasl_ssl_env(monkeypatch, pem["ca"])
    k = load_settings().kafka
    assert k.security_protocol is SecurityProtocol.SASL_SSL
    assert k.sasl_mechanism is SaslMechanism.SCRAM_SHA_512
    assert client_config(k) == {
        "bootstrap.servers": "b1:9093,b2:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "cdc",
        "sasl.password": PASSWORD,
        "ssl.ca.location": pem["ca"],
    }
    assert spark_source_options(k) == {
        "kafka.bootstrap.servers": "b1:9093,b2:9093",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        # Quotes and backslashes in the password are escaped for the JAAS parser.
        "kafka.sasl.jaas.config": (
            f'{SCRAM} required username="cdc" password="s3cr3t-\\"quoted\\"-\\\\back";'
        ),
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": pem["ca"],
    }
    # Both spellings of the password are known secrets, and no rendering shows them.
    assert PASSWORD in secret_values(k)
    assert 's3cr3t-\\"quoted\\"-\\\\back' in secret_values(k)
    s = load_settings()
    for text in (repr(s), str(s), s.model_dump_json(), repr(k)):
        assert PASSWORD not in text


@pytest.mark.parametrize(
    ("mechanism", "module"),
    [
        ("PLAIN", "org.apache.kafka.common.security.plain.PlainLoginModule"),
        ("SCRAM-SHA-256", SCRAM),
    ],
)
def test_each_password_mechanism_gets_its_login_module(mechanism: str, module: str) -> None:
    k = load_settings(
        overrides={
            "kafka": {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": mechanism,
                "sasl_username": "u",
                "sasl_password": "p",
            }
        }
    ).kafka
    opts = spark_source_options(k)
    assert opts["kafka.sasl.jaas.config"] == f'{module} required username="u" password="p";'
    assert opts["kafka.sasl.mechanism"] == mechanism
    assert "kafka.ssl.truststore.location" not in opts


def test_mutual_tls_files_for_librdkafka_and_inline_pem_for_spark(pem: dict[str, str]) -> None:
    k = load_settings(
        overrides={
            "kafka": {
                "security_protocol": "SSL",
                "ssl_ca_location": pem["ca"],
                "ssl_certificate_location": pem["cert"],
                "ssl_key_location": pem["key"],
                "ssl_key_password": "kp",
            }
        }
    ).kafka
    assert client_config(k) == {
        "bootstrap.servers": "127.0.0.1:19092",
        "security.protocol": "SSL",
        "ssl.ca.location": pem["ca"],
        "ssl.certificate.location": pem["cert"],
        "ssl.key.location": pem["key"],
        "ssl.key.password": "kp",
    }
    opts = spark_source_options(k)
    assert opts["kafka.ssl.keystore.type"] == "PEM"
    # Inline, so that executors on other machines need no copy of the files.
    assert opts["kafka.ssl.keystore.certificate.chain"] == Path(pem["cert"]).read_text()
    assert opts["kafka.ssl.keystore.key"] == Path(pem["key"]).read_text()
    assert opts["kafka.ssl.key.password"] == "kp"
    assert "kp" in secret_values(k)


def test_pass_throughs_reach_their_own_clients_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "CDC_KAFKA__CLIENT", '{"client.id": "cdc-prod", "socket.keepalive.enable": "true"}'
    )
    monkeypatch.setenv("CDC_KAFKA__SPARK_CLIENT", '{"client.dns.lookup": "use_all_dns_ips"}')
    k = load_settings().kafka
    conf = client_config(k)
    assert conf["client.id"] == "cdc-prod" and conf["socket.keepalive.enable"] == "true"
    assert "client.dns.lookup" not in conf
    opts = spark_source_options(k)
    assert opts["kafka.client.dns.lookup"] == "use_all_dns_ips"
    assert "kafka.client.id" not in opts


def test_other_mechanisms_need_their_java_login_spelled_out() -> None:
    over = {"kafka": {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"}}
    k = load_settings(overrides=over).kafka
    assert client_config(k)["sasl.mechanism"] == "OAUTHBEARER"
    with pytest.raises(ConfigError, match=r"OAUTHBEARER has no automatic mapping.*spark_client"):
        spark_source_options(k)
    jaas = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
    over["kafka"]["spark_client"] = {"sasl.jaas.config": jaas}  # type: ignore[index]
    k = load_settings(overrides=over).kafka
    assert spark_source_options(k)["kafka.sasl.jaas.config"] == jaas
    assert jaas in secret_values(k)


@pytest.mark.parametrize(
    ("kafka", "message"),
    [
        ({"security_protocol": "SASL_SSL"}, "set kafka.sasl_mechanism"),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512"},
            "set kafka.sasl_username and kafka.sasl_password",
        ),
        ({"sasl_username": "u", "sasl_password": "pw-never-shown"}, "SASL settings are set but"),
        (
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "sasl_username": "u",
                "sasl_password": "p",
                "ssl_ca_location": "/ca.pem",
            },
            "TLS files are set but kafka.security_protocol is SASL_PLAINTEXT",
        ),
        (
            {"security_protocol": "SSL", "ssl_certificate_location": "/c.pem"},
            "needs both kafka.ssl_certificate_location and kafka.ssl_key_location",
        ),
        (
            {"client": {"sasl.password": "p"}},
            "sasl.password has its own setting: kafka.sasl_password",
        ),
        ({"spark_client": {"bootstrap.servers": "x"}}, "its own setting: kafka.bootstrap_servers"),
        ({"security_protocol": "TLS"}, "security_protocol"),
    ],
)
def test_inconsistent_security_is_one_clear_line(kafka: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(overrides={"kafka": kafka})
    assert message in str(e.value)
    assert "\n" not in str(e.value)
    assert "pw-never-shown" not in str(e.value)


def test_a_missing_file_is_named_when_a_client_is_built(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere.pem")
    k = load_settings(
        overrides={"kafka": {"security_protocol": "SSL", "ssl_ca_location": missing}}
    ).kafka
    with pytest.raises(
        ConfigError, match=f"kafka.ssl_ca_location {missing} is not a readable file"
    ):
        client_config(k)
    with pytest.raises(ConfigError, match=r"kafka\.ssl_ca_location"):
        spark_source_options(k)


def test_every_secret_setting_is_a_secret_str() -> None:
    """A new password-like setting that is a plain str would be printed by `cdc config show`."""

    def walk(model: type, where: str) -> list[str]:
        plain = []
        for name, field in model.model_fields.items():  # type: ignore[attr-defined]
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                plain += walk(ann, f"{where}{name}.")
            elif any(w in name for w in ("password", "secret")) and "SecretStr" not in str(ann):
                plain.append(where + name)
        return plain

    assert walk(Settings, "") == []


# --- Redis and OpenSearch ---------------------------------------------------------------------


def test_redis_tls_files_need_a_rediss_url(pem: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"redis\.url is not rediss://"):
        load_settings(overrides={"redis": {"ssl_ca_location": pem["ca"]}})
    r = load_settings(
        overrides={
            "redis": {
                "url": "rediss://cdc:pw@cache:6380/0",
                "ssl_ca_location": pem["ca"],
                "ssl_certificate_location": pem["cert"],
                "ssl_key_location": pem["key"],
            }
        }
    ).redis
    assert redis_options(r) == {
        "ssl_ca_certs": pem["ca"],
        "ssl_certfile": pem["cert"],
        "ssl_keyfile": pem["key"],
    }
    assert redis_options(load_settings().redis) == {}


def test_redis_options_work_with_redis_py(pem: dict[str, str]) -> None:
    import redis

    r = load_settings(
        overrides={"redis": {"url": "rediss://cdc:pw@cache:6380/0", "ssl_ca_location": pem["ca"]}}
    ).redis
    client = redis.Redis.from_url(r.url.get_secret_value(), **redis_options(r))
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["username"], kwargs["password"], kwargs["ssl_ca_certs"]) == (
        "cdc",
        "pw",
        pem["ca"],
    )


def test_opensearch_basic_auth_and_tls_options(pem: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"needs both search\.username and search\.password"):
        load_settings(overrides={"search": {"username": "admin"}})
    s = load_settings(
        overrides={
            "search": {
                "url": "https://search:9200",
                "username": "admin",
                "password": "pw",
                "ssl_ca_location": pem["ca"],
            }
        }
    ).search
    assert opensearch_options(s) == {"http_auth": ("admin", "pw"), "ca_certs": pem["ca"]}
    s = load_settings(overrides={"search": {"verify_certs": False}}).search
    assert opensearch_options(s) == {"verify_certs": False, "ssl_show_warn": False}
    assert opensearch_options(load_settings().search) == {}


def test_opensearch_options_work_with_opensearch_py(pem: dict[str, str]) -> None:
    from opensearchpy import OpenSearch

    s = load_settings(
        overrides={
            "search": {
                "url": "https://search:9200",
                "username": "admin",
                "password": "pw",
                "ssl_ca_location": pem["ca"],
            }
        }
    ).search
    client = OpenSearch(hosts=[s.url.get_secret_value()], **opensearch_options(s))
    conn = client.transport.get_connection()
    assert conn.host == "https://search:9200"
    assert conn.headers["authorization"].startswith("Basic ")


def test_an_empty_variable_means_not_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SASL_MECHANISM", "SASL_USERNAME", "SASL_PASSWORD", "SSL_CA_LOCATION"):
        monkeypatch.setenv(f"CDC_KAFKA__{name}", "")
    k = load_settings().kafka
    assert (k.sasl_mechanism, k.sasl_username, k.sasl_password, k.ssl_ca_location) == (None,) * 4
    assert client_config(k) == {
        "bootstrap.servers": "127.0.0.1:19092",
        "security.protocol": "PLAINTEXT",
    }
