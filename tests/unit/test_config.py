"""The one settings object: defaults, CDC_* environment, TOML file, overrides, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgcdc.core.errors import ConfigError
from pgcdc.core.settings import SnapshotMode, load_settings

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for k in list(os.environ):
        if k.startswith("CDC_"):
            monkeypatch.delenv(k)


def test_defaults_point_at_the_local_stack() -> None:
    s = load_settings()
    assert s.postgres.dsn.get_secret_value().endswith("@127.0.0.1:55432/cdc")
    assert s.kafka.bootstrap_servers == "127.0.0.1:19092"
    assert s.redis.url.get_secret_value() == "redis://127.0.0.1:56379/0"
    assert s.search.url.get_secret_value() == "http://127.0.0.1:19200"
    assert s.postgres.snapshot_mode is SnapshotMode.INITIAL


def test_environment_names_from_the_issues(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "CDC_POSTGRES__DSN": "postgresql://u:p@db:5432/app",
        "CDC_POSTGRES__SLOT_NAME": "s1",
        "CDC_POSTGRES__PUBLICATION_NAME": "p1",
        "CDC_POSTGRES__TABLES": "public.a, shop.b",
        "CDC_POSTGRES__SNAPSHOT_MODE": "when_needed",
        "CDC_KAFKA__BOOTSTRAP_SERVERS": "k:9092",
        "CDC_KAFKA__TOPIC_PREFIX": "app",
        "CDC_SEARCH__URL": "http://os:9200",
        "CDC_SEARCH__INDEX_PREFIX": "idx",
        "CDC_REDIS__URL": "redis://r:6379/1",
        "CDC_REDIS__KEY_PREFIX": "kp",
        "CDC_SPARK__CHECKPOINT_DIR": "/ckpt",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = load_settings()
    assert s.postgres.dsn.get_secret_value() == "postgresql://u:p@db:5432/app"
    assert (s.postgres.slot_name, s.postgres.publication_name) == ("s1", "p1")
    assert s.postgres.tables == ("public.a", "shop.b")
    assert s.postgres.snapshot_mode is SnapshotMode.WHEN_NEEDED
    assert (s.kafka.bootstrap_servers, s.kafka.topic_prefix) == ("k:9092", "app")
    assert (s.search.url.get_secret_value(), s.search.index_prefix) == ("http://os:9200", "idx")
    assert (s.redis.url.get_secret_value(), s.redis.key_prefix) == ("redis://r:6379/1", "kp")
    assert s.spark.checkpoint_dir == "/ckpt"


def test_tables_as_a_json_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_POSTGRES__TABLES", '["public.a", "shop.b"]')
    assert load_settings().postgres.tables == ("public.a", "shop.b")


def test_environment_beats_the_file_and_overrides_beat_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "cdc.toml"
    f.write_text('[kafka]\ntopic_prefix = "from_file"\npartitions = 3\n')
    assert load_settings(f).kafka.topic_prefix == "from_file"
    monkeypatch.setenv("CDC_KAFKA__TOPIC_PREFIX", "from_env")
    s = load_settings(f)
    assert (s.kafka.topic_prefix, s.kafka.partitions) == ("from_env", 3)
    s = load_settings(f, {"kafka": {"topic_prefix": "from_flag"}})
    assert (s.kafka.topic_prefix, s.kafka.partitions) == ("from_flag", 3)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CDC_POSTGRES__TABLES": "nodot"}, "postgres.tables"),
        ({"CDC_POSTGRES__SNAPSHOT_MODE": "sometimes"}, "postgres.snapshot_mode"),
        ({"CDC_KAFKA__PARTITIONS": "0"}, "kafka.partitions"),
        ({"CDC_POSTGRES__SLOT_NAME": "Bad-Name"}, "postgres.slot_name"),
    ],
)
def test_bad_settings_give_one_clear_line(
    env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match=message) as e:
        load_settings()
    assert "\n" not in str(e.value)


def test_bad_config_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[kafka\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(bad)


def test_secrets_are_not_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_POSTGRES__DSN", "postgresql://u:hunter2@db/app")
    assert "hunter2" not in repr(load_settings())


# --- qualified names: one rule (pgcdc.core.qualified_names) for every setting -------------

QUOTED = '"my.schema"."my.table"'


def test_a_quoted_dotted_name_is_taken_by_every_setting_and_split_alike(tmp_path: Path) -> None:
    from cdc.incremental.signals import split_table

    env = {
        "CDC_POSTGRES__TABLES": f'{QUOTED}, public."a.b", "x,y".z',
        "CDC_POSTGRES__SIGNAL_DATA_COLLECTION": 'public."sig.nals"',
        "CDC_POSTGRES__SIGNAL_FILTER_FUNCTIONS": '"my.schema"."tenant.of", public.f',
    }
    pg = load_settings(environ=env).postgres
    assert pg.tables == (QUOTED, 'public."a.b"', '"x,y".z')  # as written
    assert pg.listed_tables == (("my.schema", "my.table"), ("public", "a.b"), ("x,y", "z"))
    assert [split_table(t) for t in pg.tables] == list(pg.listed_tables)
    assert pg.signal_table == ("public", "sig.nals") == split_table('public."sig.nals"')
    assert pg.signal_filter_functions == ('"my.schema"."tenant.of"', "public.f")

    f = tmp_path / "cdc.toml"
    f.write_text(f"[postgres]\ntables = ['{QUOTED}']\nsignal_data_collection = '{QUOTED}'\n")
    pg = load_settings(f, environ={}).postgres
    assert pg.listed_tables == (("my.schema", "my.table"),)
    assert pg.signal_table == ("my.schema", "my.table")


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("a", "must be written as schema.{what}"),
        ("a.b.c", "must be written as schema.{what}"),
        (".b", "must be written as schema.{what}"),
        ("a.", "must be written as schema.{what}"),
        ('"a.b', "unterminated quote"),
        ('a"b".c', "a quote must enclose a whole part"),
    ],
)
@pytest.mark.parametrize(
    ("setting", "what"),
    [
        ("postgres.tables", "table"),
        ("postgres.signal_data_collection", "table"),
        ("postgres.signal_filter_functions", "function"),
    ],
)
def test_a_name_that_is_not_schema_dot_name_is_refused_naming_the_setting(
    name: str, reason: str, setting: str, what: str
) -> None:
    variable = "CDC_" + setting.upper().replace(".", "__")
    with pytest.raises(ConfigError) as e:
        load_settings(environ={variable: name})
    message = str(e.value)
    assert message.startswith(f"invalid setting {setting} = ")
    assert f"(from {variable}): " in message
    assert message.endswith(reason.format(what=what)), message


def test_toml_lines_of_arrays_of_tables() -> None:
    """Where a problem inside an array of tables was set: its n-th table (index n), and
    the tables of arrays inside it, as pydantic's error locations name them."""
    from pgcdc.core.settings_sources import toml_line

    text = """\
[search]
index_prefix = "shop"

[[search.documents]]
name = "a"
[[search.documents.lookups]]
name = "a1"
fields = ["x"]
[[search.documents.lookups]]
name = "a2"

[[search.documents]]
name = "b"
[[search.documents.lookups]]
name = "b1"
nested = [{ name = "inline" }]
"""
    assert toml_line(text, ("search", "index_prefix")) == 2
    assert toml_line(text, ("search", "documents")) == 4
    assert toml_line(text, ("search", "documents", 0)) == 4
    assert toml_line(text, ("search", "documents", 0, "lookups", 0)) == 6
    assert toml_line(text, ("search", "documents", 0, "lookups", 0, "fields")) == 8
    assert toml_line(text, ("search", "documents", 0, "lookups", 1, "name")) == 10
    assert toml_line(text, ("search", "documents", 1)) == 12
    assert toml_line(text, ("search", "documents", 1, "lookups", 0, "name")) == 15
    assert toml_line(text, ("search", "documents", 1, "lookups", 0, "nested", 0, "x")) == 16
    assert toml_line(text, ("search", "documents", 1, "lookups", 1)) is None
