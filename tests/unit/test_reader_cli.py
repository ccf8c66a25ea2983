"""The ``cdc`` command line's logging: structured fields on every line, text or JSON."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from cdc.cli import _setup_logging
from pgcdc.core.settings import Settings, load_settings

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    rdkafka = logging.getLogger("cdc.librdkafka")
    rdkafka_level = rdkafka.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    rdkafka.setLevel(rdkafka_level)


def _replication_started() -> None:
    logging.getLogger("cdc.replication").info(
        "replication started", extra={"slot": "s1", "lsn": "0/16B3748"}
    )


def test_text_logs_show_the_structured_fields(capsys: pytest.CaptureFixture[str]) -> None:
    _setup_logging(Settings(log_level="INFO", log_json=False), debug=False)
    _replication_started()
    line = capsys.readouterr().err.strip()
    assert "INFO cdc.replication: replication started" in line
    assert line.endswith("slot=s1 lsn=0/16B3748")


def test_json_logs_carry_the_fields_as_keys(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CDC_LOG_JSON", "true")
    settings = load_settings()
    assert settings.log_json
    _setup_logging(settings, debug=False)
    _replication_started()
    record = json.loads(capsys.readouterr().err.strip())
    assert record["message"] == "replication started"
    assert record["slot"] == "s1" and record["lsn"] == "0/16B3748"


def test_a_level_override_and_a_quiet_librdkafka(capsys: pytest.CaptureFixture[str]) -> None:
    _setup_logging(Settings(log_json=False), debug=False, level="WARNING")
    _replication_started()
    logging.getLogger("cdc.librdkafka").error("broker down")
    assert capsys.readouterr().err == ""
    _setup_logging(Settings(log_json=False), debug=True)
    logging.getLogger("cdc.librdkafka").debug("broker chatter")
    assert "broker chatter" in capsys.readouterr().err
