"""``cdc config show``: each setting's effective value, masked secrets, and its source."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cdc.cli import app
from cdc.config_check import CheckResult
from cdc.config_show import parse_assignments
from pgcdc.core.errors import ConfigError
from pgcdc.core.settings import load_settings

pytestmark = pytest.mark.unit

PASSWORD = "pg-s3cret-pw"
REDIS_PASSWORD = "redis-s3cret-pw"
KAFKA_PASSWORD = "kafka-s3cret-pw"


def _rows(output: str) -> dict[str, tuple[str, str]]:
    out = {}
    for line in output.splitlines():
        name, *value, source = line.split()
        out[name] = (" ".join(value), source.strip("()"))
    return out


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith("CDC_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_every_source_and_masked_secrets(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    config = tmp_path / "cdc.toml"
    config.write_text(
        '[postgres]\nslot_name = "from_file"\npublication_name = "file_pub"\n'
        '[kafka]\ntopic_prefix = "fileprefix"\n'
    )
    clean_env.setenv("CDC_POSTGRES__DSN", f"postgresql://cdc:{PASSWORD}@db:5432/app")
    clean_env.setenv("CDC_POSTGRES__PUBLICATION_NAME", "env_pub")
    clean_env.setenv("CDC_REDIS__URL", f"rediss://app:{REDIS_PASSWORD}@cache:6380/0")
    clean_env.setenv("CDC_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    clean_env.setenv("CDC_KAFKA__SASL_MECHANISM", "SCRAM-SHA-512")
    clean_env.setenv("CDC_KAFKA__SASL_USERNAME", "app")
    clean_env.setenv("CDC_KAFKA__SASL_PASSWORD", KAFKA_PASSWORD)
    result = CliRunner().invoke(
        app,
        ["config", "show", "--config", str(config), "--set", "kafka.topic_prefix=flagprefix"],
    )
    assert result.exit_code == 0, result.output
    for secret in (PASSWORD, REDIS_PASSWORD, KAFKA_PASSWORD):
        assert secret not in result.output
    rows = _rows(result.stdout)
    assert rows["postgres.slot_name"] == ("from_file", "file")
    assert rows["postgres.publication_name"] == ("env_pub", "env")  # env beats the file
    assert rows["kafka.topic_prefix"] == ("flagprefix", "flag")  # a flag beats the file
    assert rows["postgres.snapshot_mode"] == ("initial", "default")
    assert rows["postgres.dsn"] == ("postgresql://cdc:***@db:5432/app", "env")
    assert rows["redis.url"] == ("rediss://app:***@cache:6380/0", "env")
    assert rows["kafka.sasl_password"] == ("***", "env")
    assert rows["kafka.sasl_username"] == ("app", "env")


def test_declared_documents_are_shown_one_a_row_as_the_environment_takes_them(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "cdc.toml"
    config.write_text(
        '[[search.documents]]\nname = "products"\ntable = "public.products"\nkey = "id"\n'
        'fields = ["id"]\n[[search.documents.nested]]\nname = "stock"\n'
        'table = "public.stock_levels"\nforeign_key = "product_id"\nfields = ["quantity"]\n'
        'aggregates = { total = "sum(quantity)" }\n'
        '[[search.documents]]\nname = "orders"\ntable = "public.orders"\nkey = "id"\n'
        'fields = ["id"]\n'
    )
    result = CliRunner().invoke(app, ["config", "show", "--config", str(config)])
    assert result.exit_code == 0, result.output
    rows = _rows(result.stdout)
    assert rows['search.documents["orders"]'] == (
        '{"name": "orders", "table": "public.orders", "key": "id", "fields": ["id"], '
        '"lookups": [], "nested": []}',
        "file",
    )
    shown, source = rows['search.documents["products"]']
    assert source == "file"
    env = {"CDC_SEARCH__DOCUMENTS": f"[{shown}]"}
    (again,) = load_settings(environ=env).search.documents
    assert again == load_settings(config, environ={}).search.documents[0]


def test_a_key_value_dsn_is_masked(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("CDC_POSTGRES__DSN", f"host=db dbname=app user=cdc password={PASSWORD}")
    result = CliRunner().invoke(app, ["config", "show"])
    assert result.exit_code == 0, result.output
    assert PASSWORD not in result.output
    assert "password=***" in _rows(result.stdout)["postgres.dsn"][0]


def test_set_needs_a_name_and_a_value() -> None:
    assert parse_assignments(["postgres.slot_name=s1", "log_level=DEBUG"]) == {
        "postgres": {"slot_name": "s1"},
        "log_level": "DEBUG",
    }
    with pytest.raises(ConfigError, match=r"section\.name=value"):
        parse_assignments(["postgres.slot_name"])


def test_check_lines() -> None:
    assert CheckResult("kafka", True, "1 broker").line() == "ok   kafka: 1 broker"
    line = CheckResult("postgres", False, "wal_level = replica", "set it").line()
    assert line == "FAIL postgres: wal_level = replica; fix: set it"
