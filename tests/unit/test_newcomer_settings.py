"""A newcomer's settings mistakes, each named with its fix (issue 26): a ``CDC_*`` variable
that is no setting (each mistyped form) stops the command naming it and the closest valid one;
invalid values are all reported at once, each with where it came from (variable, file and
line, flag); no secret is ever quoted; the exit status is 2 (the settings are wrong)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cdc.cli import app
from pgcdc.core.errors import ConfigError
from pgcdc.core.settings import load_settings

pytestmark = pytest.mark.unit

SECRET = "s3cret-Pa55word"
SETTINGS_WRONG = 2  # the documented exit status when the settings are wrong


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("CDC_"):
            monkeypatch.delenv(name)


def _show(*args: str) -> tuple[int, str, float]:
    """``cdc config show`` (it loads the settings as every command does): exit status,
    everything printed, seconds."""
    started = time.monotonic()
    result = CliRunner().invoke(app, ["config", "show", *args])
    return result.exit_code, result.output, time.monotonic() - started


@pytest.mark.parametrize(
    ("variable", "meant", "hint"),
    [
        # a wrong section
        ("CDC_POSTGRE__DSN", "CDC_POSTGRES__DSN", ""),
        # one underscore between section and name
        ("CDC_POSTGRES_DSN", "CDC_POSTGRES__DSN", "two underscores"),
        ("CDC_KAFKA_TOPIC_PREFIX", "CDC_KAFKA__TOPIC_PREFIX", "two underscores"),
        # a misspelled top-level setting
        ("CDC_LOG_LEVL", "CDC_LOG_LEVEL", ""),
        # a misspelled name in a section
        ("CDC_POSTGRES__SLOTNAME", "CDC_POSTGRES__SLOT_NAME", ""),
        # lower case is read like upper case, and named as written
        ("cdc_kafka__topic_prefx", "CDC_KAFKA__TOPIC_PREFIX", ""),
    ],
)
def test_a_mistyped_variable_is_refused_with_the_one_meant(
    variable: str, meant: str, hint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, f"postgresql://app:{SECRET}@db.internal:5432/app")
    code, out, seconds = _show()
    assert code == SETTINGS_WRONG, out
    assert f"{variable} is not a setting: did you mean {meant}?" in out
    assert hint in out and "docs/settings.md" in out and "Rename or unset it" in out
    assert SECRET not in out
    assert seconds < 5  # at once: nothing was connected to


def test_without_a_close_name_the_variable_is_still_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_WHATEVER", "1")
    code, out, _ = _show()
    assert code == SETTINGS_WRONG
    assert "CDC_WHATEVER is not a setting: unset it or rename it" in out


def test_the_config_files_path_and_the_test_switches_are_not_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "cdc.toml"
    config.write_text('[kafka]\ntopic_prefix = "app"\n')
    monkeypatch.setenv("CDC_CONFIG", str(config))
    monkeypatch.setenv("CDC_TEST_NATIVE", "1")
    assert load_settings().kafka.topic_prefix == "app"


def test_every_invalid_value_at_once_with_where_it_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "cdc.toml"
    config.write_text(
        '[postgres]\nslot_name = "ok_slot"\nsnapshot_mode = "sometimes"\n\n'
        "[kafka]\npartitions = 0\n\n[redis]\nttl = 60\n"
    )
    monkeypatch.setenv("CDC_SCHEMA__VALUE_FORMAT", "xml")
    monkeypatch.setenv("CDC_POSTGRES_DSN", "x")
    code, out, _ = _show("--config", str(config), "--set", "health_port=99999")
    assert code == SETTINGS_WRONG, out
    assert "6 problems with the settings:" in out
    expected = [
        "CDC_POSTGRES_DSN is not a setting: did you mean CDC_POSTGRES__DSN?",
        "invalid setting postgres.snapshot_mode = 'sometimes' (from "
        f"{config} line 3): Input should be 'initial', 'no_data', 'initial_only' or "
        "'when_needed'",
        f"invalid setting kafka.partitions = 0 (from {config} line 6): Input should be greater "
        "than or equal to 1",
        f"redis.ttl (from {config} line 9) is not a setting: did you mean redis.ttl_s?",
        "invalid setting schema.value_format = 'xml' (from CDC_SCHEMA__VALUE_FORMAT): Input "
        "should be 'json' or 'avro'",
        "invalid setting health_port = '99999' (from --set health_port): Input should be less "
        "than or equal to 65535",
    ]
    flat = " ".join(out.split())
    for line in expected:
        assert " ".join(line.split()) in flat, line


def test_a_bad_toml_file_names_the_file_line_and_column(tmp_path: Path) -> None:
    config = tmp_path / "cdc.toml"
    config.write_text('[kafka]\ntopic_prefix = "app\n')
    code, out, _ = _show("--config", str(config))
    assert code == SETTINGS_WRONG
    assert f"config file {config} is not valid TOML" in out and "line 2" in out


def test_a_secret_is_never_quoted(monkeypatch: pytest.MonkeyPatch) -> None:
    # A SASL login over PLAINTEXT: the check names where each setting came from, not values.
    monkeypatch.setenv("CDC_KAFKA__SASL_USERNAME", "app")
    monkeypatch.setenv("CDC_KAFKA__SASL_PASSWORD", SECRET)
    with pytest.raises(ConfigError) as e:
        load_settings()
    text = str(e.value)
    assert "invalid settings in [kafka]" in text and "CDC_KAFKA__SASL_PASSWORD" in text
    assert "security_protocol is PLAINTEXT; use SASL_SSL" in text
    assert SECRET not in text
    # An invalid value that may be a secret is not quoted either.
    monkeypatch.delenv("CDC_KAFKA__SASL_USERNAME")
    monkeypatch.delenv("CDC_KAFKA__SASL_PASSWORD")
    monkeypatch.setenv("CDC_KAFKA__CLIENT", '{"sasl.password": 12345678}')
    with pytest.raises(ConfigError) as e:
        load_settings()
    assert str(e.value) == (
        "invalid setting kafka.client.sasl.password (from CDC_KAFKA__CLIENT, value not shown): "
        "Input should be a valid string"
    )


def test_a_table_setting_that_is_not_json_names_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CDC_KAFKA__CLIENT", "client.id=app")
    code, out, _ = _show()
    assert code == SETTINGS_WRONG
    assert "CDC_KAFKA__CLIENT is not valid JSON" in out and '{"client.id": "app"}' in out


def test_the_direct_read_with_min_partitions_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CDC_SPARK__READ", "direct")
    monkeypatch.setenv("CDC_SPARK__MIN_PARTITIONS", "4")
    code, out, _ = _show()
    assert code == SETTINGS_WRONG, out
    assert "spark.read = direct does not" in " ".join(out.split())


def test_the_jobs_read_directly_unless_min_partitions_asks_spark_to_split() -> None:
    from pgcdc.core.spark_settings import ReadPath, SparkSettings

    assert SparkSettings().read is ReadPath.DIRECT
    assert SparkSettings(min_partitions=4).read is ReadPath.SPARK
    assert SparkSettings(read="spark").read is ReadPath.SPARK
