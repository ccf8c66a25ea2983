"""A batch's records → the join's changes (spark_jobs.documents.RecordChanges): Connect
JSON records as the reader writes them, decoded by the followers' parse and converter; a
``numeric`` join value compares as the converter gives it in the key and in the row that
references it; unchanged TOAST columns take the value the state holds; unused columns are
not kept. No Spark, no servers."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
import pytest

from benchmarks.envelope import rows as table_rows
from benchmarks.envelope import sources, table
from pgcdc.core.contract import (
    HEADER_UNCHANGED,
    VersionOrder,
    encode_unchanged_header,
)
from pgcdc.core.contract import (
    UNAVAILABLE_VALUE_PLACEHOLDER as PLACEHOLDER,
)
from pgcdc.core.errors import ConfigError
from pgcdc.core.settings import SchemaSettings, Settings, ValueFormat
from schemas.envelope import EventEncoder
from schemas.formats import format_for
from spark_jobs.avro_input import AvroTranscoder
from spark_jobs.documents import RecordChanges, document_writes, used_columns
from spark_jobs.documents_sync import DEFAULT_MAX_OFFSETS, job_options
from spark_jobs.join import DocumentSpec, JoinState, Lookup
from spark_jobs.options import JobOptions
from spark_jobs.parse import KafkaRecord

pytestmark = pytest.mark.unit

TABLE = table()  # the benchmarks' 10-column table, values as pgoutput sends them
(SOURCE,) = sources(1)

PREFIX = "srv"
SPEC = DocumentSpec(
    root="public.products",
    root_key="id",
    fields=("id", "title", "code"),
    lookups=(Lookup("category", "public.categories", on="code", key="code", fields=("name",)),),
)
DECIMAL: dict[str, Any] = {
    "type": "bytes",
    "name": "org.apache.kafka.connect.data.Decimal",
    "parameters": {"scale": "2"},
}
COLUMNS: dict[str, list[dict[str, Any]]] = {
    "public.products": [
        {"field": "id", "type": "int32"},
        {"field": "title", "type": "string"},
        {"field": "code", **DECIMAL},
        {"field": "description", "type": "string"},
    ],
    "public.categories": [{"field": "code", **DECIMAL}, {"field": "name", "type": "string"}],
}
KEYS = {"public.products": ["id"], "public.categories": ["code"]}


def _decimal(cents: int) -> str:
    """A Connect Decimal of scale 2, as JsonConverter writes it: base64 of the unscaled."""
    return base64.b64encode(cents.to_bytes(2, "big", signed=True)).decode()


def _headers(lsn: int) -> list[tuple[str, bytes | None]]:
    return [
        (k, v if isinstance(v, bytes | None) else v.encode())
        for k, v in VersionOrder(lsn, 0).headers()
    ]


def _record(
    table: str, offset: int, lsn: int, after: dict[str, Any] | None, unchanged: tuple[str, ...] = ()
) -> KafkaRecord:
    fields = COLUMNS[table]
    key_fields = [f for f in fields if f["field"] in KEYS[table]]
    row = after or {}
    key: dict[str, Any] = {"schema": {"type": "struct", "fields": key_fields}, "payload": {}}
    key["payload"] = {f["field"]: row.get(f["field"]) for f in key_fields}
    schema = {
        "type": "struct",
        "fields": [
            {"field": "before", "type": "struct", "optional": True, "fields": fields},
            {"field": "after", "type": "struct", "optional": True, "fields": fields},
            {"field": "op", "type": "string"},
        ],
    }
    value = orjson.dumps({"schema": schema, "payload": {"op": "u", "before": None, "after": row}})
    headers = _headers(lsn)
    if unchanged:
        headers.append((HEADER_UNCHANGED, encode_unchanged_header(unchanged)))
    return KafkaRecord(f"{PREFIX}.{table}", 0, offset, orjson.dumps(key), value, headers)


def _tombstone(table: str, offset: int, lsn: int, key_payload: dict[str, Any]) -> KafkaRecord:
    key_fields = [f for f in COLUMNS[table] if f["field"] in KEYS[table]]
    key = {"schema": {"type": "struct", "fields": key_fields}, "payload": key_payload}
    return KafkaRecord(f"{PREFIX}.{table}", 0, offset, orjson.dumps(key), None, _headers(lsn))


def test_records_become_the_joins_changes() -> None:
    states = {"cdc-products": JoinState(SPEC)}
    changes = RecordChanges(PREFIX, [SPEC])
    product = {"id": 1, "title": "lamp", "code": _decimal(123), "description": "x" * 50}
    events, touched, dead = changes.apply(
        [
            # The product first, its category after it (a late lookup row).
            _record("public.products", 0, 100, product),
            _record("public.categories", 0, 90, {"code": _decimal(123), "name": "lights"}),
        ],
        states,
    )
    assert touched == {"cdc-products": {1}} and len(events) == 2 and dead == []
    state = states["cdc-products"]
    # The decimal is the converter's text in the key and in the row that references it.
    assert events[1].key == ("1.23",)  # type: ignore[union-attr]
    assert state.document(1) == (
        2,
        {"id": 1, "title": "lamp", "code": "1.23", "category": {"name": "lights"}},
    )
    assert "description" not in state.rows["public.products"][(1,)].row  # type: ignore[operator]
    # An update leaving the title out as unchanged TOAST: the state's value is kept.
    later = {"id": 1, "title": PLACEHOLDER, "code": _decimal(123), "description": "y"}
    events, _, _ = changes.apply([_record("public.products", 1, 110, later, ("title",))], states)
    assert events[0].row == {"id": 1, "title": "lamp", "code": "1.23"}  # type: ignore[union-attr]
    # The category's tombstone, keyed by its decimal: the lookup is gone.
    changes.apply([_tombstone("public.categories", 1, 120, {"code": _decimal(123)})], states)
    ((doc_id, version, doc),) = document_writes(state, {1})
    assert (doc_id, version) == ("1", 4) and doc is not None and doc["category"] is None


def test_records_no_change_can_be_read_from_are_dead_letters_and_the_rest_applied() -> None:
    states = {"cdc-products": JoinState(SPEC)}
    good = _record("public.products", 2, 100, {"id": 2, "title": "a", "code": None})
    not_json = good._replace(offset=3, value=b"{not json")
    no_key = good._replace(offset=4, key=b"[1]")
    events, touched, dead = RecordChanges(PREFIX, [SPEC]).apply([not_json, no_key, good], states)
    assert len(events) == 1 and touched == {"cdc-products": {2}}
    assert [(d["offset"], d["table"], d["value"]) for d in dead] == [
        (3, "public.products", "{not json"),
        (4, "public.products", good.value.decode()),  # type: ignore[union-attr]
    ]
    assert "not a Debezium event" in dead[0]["reason"]
    assert "not a JSON object of key columns" in dead[1]["reason"]


def test_only_the_columns_a_document_uses_are_kept() -> None:
    assert used_columns([SPEC]) == {
        "public.products": frozenset({"id", "title", "code"}),
        "public.categories": frozenset({"code", "name"}),
    }


def test_the_job_reads_the_documents_topics_in_batches_it_can_hold() -> None:
    doc: dict[str, Any] = {"name": "products", "table": "public.products", "key": "id"}
    doc["fields"] = ["id"]
    doc["lookups"] = [
        {
            "name": "category",
            "table": 'public."Categories"',
            "foreign_key": "category_id",
            "references": "id",
            "fields": ["name"],
        }
    ]
    settings = Settings(
        kafka={"topic_prefix": "srv"},  # type: ignore[arg-type]
        search={"documents": [doc]},  # type: ignore[arg-type]
        spark={"checkpoint_dir": "/tmp/unused"},  # type: ignore[arg-type]
    )
    given = JobOptions(
        name="documents_sync",
        heartbeat_topic="__cdc-heartbeat.srv",
        topics=(),
        topic_pattern="srv\\..*",
        starting_offsets="earliest",
        checkpoint="/tmp/unused/documents_sync",
        available_now=True,
        trigger_interval="1 second",
        max_offsets_per_trigger=200_000,  # the sync jobs' default with --available-now
    )
    opts = job_options(settings, given)
    assert opts.topics == ("srv.public.products", "srv.public.Categories")
    assert (opts.topic_pattern, opts.heartbeat_topic) == (None, None)
    assert opts.max_offsets_per_trigger == DEFAULT_MAX_OFFSETS
    assert job_options(settings, given, asked_limit=True).max_offsets_per_trigger == 200_000
    none = settings.model_copy(
        update={"search": settings.search.model_copy(update={"documents": ()})}
    )
    with pytest.raises(ConfigError, match="no document is declared"):
        job_options(none, given)


def test_avro_records_give_the_changes_their_json_gives(tmp_path: Path) -> None:
    """With schema.value_format = avro, a record is read into Connect JSON first (key and
    value): the same join changes as the JSON record of the same row; one that is no Avro
    event of its topic is a dead letter with the transcoder's reason."""
    avro = SchemaSettings(value_format=ValueFormat.AVRO, avro_schema_dir=str(tmp_path))
    spec = DocumentSpec(
        root="public.customers", root_key="id", fields=("id", "name", "balance", "born")
    )

    def records(schema: SchemaSettings) -> list[KafkaRecord]:
        enc = EventEncoder(schema, PREFIX, "db", event_format=format_for(schema))
        out = []
        for offset, row in enumerate(table_rows(3)):
            key, value = enc.encode_key(TABLE, row), enc.encode_value(TABLE, "c", None, row, SOURCE)
            out.append(
                KafkaRecord(
                    f"{PREFIX}.public.customers", 0, offset, key, value, _headers(70 + offset)
                )
            )
        return out

    def changes(recs: list[KafkaRecord], transcode: Any = None) -> tuple[list[Any], list[Any]]:
        states = {"i": JoinState(spec)}
        events, _, dead = RecordChanges(PREFIX, [spec], transcode).apply(recs, states)
        return events, dead

    want, _ = changes(records(SchemaSettings()))
    avro_records = records(avro)
    junk = avro_records[0]._replace(offset=9, value=b"\xc3\x01" + b"\x00" * 8 + b"junk")
    got, dead = changes([*avro_records, junk], AvroTranscoder(avro).transcode)
    assert got == want and len(want) == 3
    assert isinstance(want[0].key[0], int) and isinstance(want[0].row["balance"], str)
    assert [d["offset"] for d in dead] == [9] and dead[0]["reason"].startswith(
        "cannot be joined: Avro: "
    )
