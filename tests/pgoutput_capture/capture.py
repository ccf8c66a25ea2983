"""The capture's database connection: read a slot's binary changes, and ask PostgreSQL for
the fields a decoder must produce (the oracle)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "pgoutput"
DB = "pgoutput_capture"

Row = tuple[str, int | None, bytes]  # lsn, xid, data
Json = dict[str, Any]


class Capture:
    """One database, one logical slot per scenario."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, dbname=DB, autocommit=True)
        self.conn.execute("SET TimeZone = 'UTC'")
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")

    def q(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        cur = self.conn.execute(query, args or None)  # type: ignore[call-overload]
        return cur.fetchall() if cur.description else []

    def one(self, query: str, *args: Any) -> Any:
        return self.q(query, *args)[0][0]

    def text(self, expr: str) -> str | None:
        """What PostgreSQL's output function makes of a SQL expression: the oracle."""
        # concat() renders through the type's output function, as pgoutput does; a ::text
        # cast would not (bool casts to 'true' but is output as 't').
        is_null, rendered = self.q(f"SELECT ({expr}) IS NULL, concat(({expr}))")[0]
        return None if is_null else str(rendered)

    def create_slot(self, slot: str, two_phase: bool = False) -> None:
        self.q(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)", slot, two_phase
        )

    def changes(self, slot: str, options: dict[str, str]) -> list[Row]:
        flat = [x for kv in options.items() for x in kv]
        placeholders = ", ".join(["%s"] * len(flat))
        rows = self.q(
            f"SELECT lsn::text, xid::text::bigint, data FROM "
            f"pg_logical_slot_get_binary_changes(%s, NULL, NULL, {placeholders})",
            slot,
            *flat,
        )
        self.q("SELECT pg_drop_replication_slot(%s)", slot)
        return [(lsn, xid, bytes(data)) for lsn, xid, data in rows]

    # ------------------------------------------------------------ expected-field builders

    def relation(self, table: str, identity: str, xid: int | None = None) -> Json:
        oid, nsp, name = self.q(
            "SELECT c.oid, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE c.oid = %s::regclass",
            table,
        )[0]
        key_cols = {
            r[0]
            for r in self.q(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
                table,
            )
        }
        cols = []
        for attname, atttypid, atttypmod in self.q(
            "SELECT attname, atttypid, atttypmod FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            table,
        ):
            # Under REPLICA IDENTITY FULL every column is part of the identity.
            is_key = identity == "f" or attname in key_cols
            cols.append(
                {
                    "flags": int(is_key),
                    "name": attname,
                    "type_oid": atttypid,
                    "type_modifier": atttypmod,
                }
            )
        return msg(
            "Relation",
            relation_id=oid,
            namespace=nsp,
            name=name,
            replica_identity=identity,
            columns=cols,
            xid=xid,
        )

    def type_msg(self, type_name: str, xid: int | None = None) -> Json:
        oid, nsp, name = self.q(
            "SELECT t.oid, n.nspname, t.typname FROM pg_type t JOIN pg_namespace n "
            "ON n.oid = t.typnamespace WHERE t.oid = %s::regtype",
            type_name,
        )[0]
        return msg("TypeMessage", type_oid=oid, namespace=nsp, name=name, xid=xid)

    def oid(self, table: str) -> int:
        return int(self.one("SELECT %s::regclass::oid", table))

    def commit_lsn(self, end_lsn: str) -> str:
        """The start of the COMMIT (or PREPARE...) record that ends at ``end_lsn``."""
        # Look back a little from the end; the commit record is the last one before end_lsn.
        rows = self.q(
            "SELECT start_lsn::text, record_type FROM pg_get_wal_records_info("
            "  %s::text::pg_lsn - 8192, %s::text::pg_lsn) WHERE end_lsn = %s::text::pg_lsn "
            "AND resource_manager = 'Transaction'",
            end_lsn,
            end_lsn,
            end_lsn,
        )
        if len(rows) != 1:
            raise SystemExit(f"no single Transaction record ends at {end_lsn}: {rows}")
        return str(rows[0][0])

    def commit_ts_us(self, xid: int) -> int:
        return int(
            self.one(
                "SELECT (extract(epoch FROM pg_xact_commit_timestamp(%s::text::xid)) * 1e6)::bigint",
                xid,
            )
        )

    def begin(self, xid: int, commit_end: str) -> Json:
        return msg(
            "Begin",
            final_lsn=self.commit_lsn(commit_end),
            commit_ts_us=self.commit_ts_us(xid),
            xid=xid,
        )

    def commit(self, xid: int, commit_end: str) -> Json:
        return msg(
            "Commit",
            flags=0,
            commit_lsn=self.commit_lsn(commit_end),
            end_lsn=commit_end,
            commit_ts_us=self.commit_ts_us(xid),
        )


def msg(type_: str, **fields: Any) -> Json:
    return {"type": type_, "fields": fields}


def toast() -> Json:
    return {"unchanged_toast": True}


def hexbytes(b: bytes) -> Json:
    return {"hex": b.hex()}


def write_bin(out: Path, name: str, rows: Sequence[Row]) -> None:
    with open(out / f"{name}.bin", "wb") as f:
        for _, _, data in rows:
            f.write(struct.pack("!I", len(data)))
            f.write(data)


def types_of(rows: Sequence[Row]) -> str:
    return "".join(chr(r[2][0]) for r in rows)


def check_shape(name: str, rows: Sequence[Row], shape: str) -> None:
    got = types_of(rows)
    if got != shape:
        raise SystemExit(f"scenario {name}: expected message types {shape!r}, server sent {got!r}")


# Each scenario returns (sql run, slot options, rows, expected messages).
Scenario = Callable[["Capture"], tuple[list[str], dict[str, str], list[Row], list[Json]]]
P1 = {"proto_version": "1", "publication_names": "pub"}


def run(c: Capture, statements: Sequence[str]) -> None:
    """Run the statements one by one."""
    for s in statements:
        c.q(s)
