"""docs/settings.md is generated from the settings model and kept up to date."""

from __future__ import annotations

import os

import pytest

from pgcdc.core import settings_doc
from pgcdc.core.settings import load_settings

pytestmark = pytest.mark.unit


def test_the_checked_in_reference_is_up_to_date() -> None:
    assert settings_doc.DOC.exists(), "run: python -m pgcdc.core.settings_doc"
    assert settings_doc.DOC.read_text() == settings_doc.render(), (
        "docs/settings.md is stale: run python -m pgcdc.core.settings_doc and commit it"
    )
    assert settings_doc.main(["--check"]) == 0


def _rows() -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip("|").split(" | ")]
        for line in settings_doc.render().splitlines()
        if line.startswith("| `")
    ]


def test_every_setting_is_listed_once_with_a_meaning() -> None:
    rows = _rows()
    names = [r[0].strip("`") for r in rows]
    expected = [
        f"{section}.{name}" if section else name
        for section, cls in settings_doc.sections()
        for name, field in cls.model_fields.items()
        if not (isinstance(field.annotation, type) and hasattr(field.annotation, "model_fields"))
    ]
    assert names == expected
    assert len(set(names)) == len(names)
    assert [r[0] for r in rows if not r[4]] == [], "each setting needs a meaning"
    # Debezium's names are listed where one exists.
    debezium = {r[0].strip("`"): r[5] for r in rows}
    assert debezium["postgres.slot_name"] == "`slot.name`"
    assert debezium["kafka.topic_prefix"] == "`topic.prefix`"


def test_the_environment_names_listed_are_the_ones_read(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("CDC_"):
            monkeypatch.delenv(k)
    env = {r[0].strip("`"): r[1].strip("`") for r in _rows()}
    monkeypatch.setenv(env["postgres.slot_name"], "from_env")
    monkeypatch.setenv(env["schema.decimal_handling_mode"], "string")
    monkeypatch.setenv(env["log_level"], "DEBUG")
    monkeypatch.setenv(env["kafka.client"], '{"client.id": "x"}')
    s = load_settings()
    assert s.postgres.slot_name == "from_env"
    assert s.schema_.decimal_handling_mode == "string"
    assert s.log_level == "DEBUG"
    assert s.kafka.client == {"client.id": "x"}


def test_no_default_depends_on_the_machine() -> None:
    text = settings_doc.render()
    assert os.getcwd() not in text
    assert "`.stack/checkpoints`" in text
