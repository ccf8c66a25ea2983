"""The fixed parts of a Debezium PostgreSQL change event: the ``source`` and ``transaction``
blocks' schemas, the allowed operation codes and snapshot markers, and the envelope schema
around a table's row schema."""

from __future__ import annotations

from schemas.connect import ConnectSchema, connect_schema, with_field

CONNECTOR = "postgresql"
# Allowed values of source.snapshot (Debezium's SnapshotRecord enum).
SNAPSHOT_VALUES = (
    "true",
    "first",
    "first_in_data_collection",
    "last_in_data_collection",
    "last",
    "false",
    "incremental",
)
OPS = frozenset("crudt")

SOURCE_SCHEMA: ConnectSchema = connect_schema(
    "struct",
    False,
    name="io.debezium.connector.postgresql.Source",
    version=1,
    fields=[
        with_field(connect_schema("string", False), "version"),
        with_field(connect_schema("string", False), "connector"),
        with_field(connect_schema("string", False), "name"),
        with_field(connect_schema("int64", False), "ts_ms"),
        {
            **connect_schema(
                "string",
                True,
                name="io.debezium.data.Enum",
                version=1,
                parameters={"allowed": ",".join(SNAPSHOT_VALUES)},
            ),
            "default": "false",
            "field": "snapshot",
        },
        with_field(connect_schema("string", False), "db"),
        with_field(connect_schema("string", True), "sequence"),
        with_field(connect_schema("int64", True), "ts_us"),
        with_field(connect_schema("int64", True), "ts_ns"),
        with_field(connect_schema("string", False), "schema"),
        with_field(connect_schema("string", False), "table"),
        with_field(connect_schema("int64", True), "txId"),
        with_field(connect_schema("int64", True), "lsn"),
        with_field(connect_schema("int64", True), "xmin"),
        # Debezium 3.x: the replication origin of the change (null without one).
        with_field(connect_schema("string", True), "origin"),
        with_field(connect_schema("int64", True), "origin_lsn"),
    ],
)

TRANSACTION_SCHEMA: ConnectSchema = connect_schema(
    "struct",
    True,
    name="event.block",
    version=1,
    fields=[
        with_field(connect_schema("string", False), "id"),
        with_field(connect_schema("int64", False), "total_order"),
        with_field(connect_schema("int64", False), "data_collection_order"),
    ],
)


def envelope_schema(name: str, value_schema: ConnectSchema) -> ConnectSchema:
    """The schema of a table's change events, ``before`` and ``after`` being its rows."""
    return connect_schema(
        "struct",
        False,
        name=name,
        version=2,
        fields=[
            with_field(value_schema, "before"),
            with_field(value_schema, "after"),
            with_field(SOURCE_SCHEMA, "source"),
            with_field(TRANSACTION_SCHEMA, "transaction"),
            with_field(connect_schema("string", False), "op"),
            with_field(connect_schema("int64", True), "ts_ms"),
            with_field(connect_schema("int64", True), "ts_us"),
            with_field(connect_schema("int64", True), "ts_ns"),
        ],
    )
