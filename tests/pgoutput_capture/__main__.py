"""``python -m tests.pgoutput_capture --dsn ...``: run every scenario, write the fixtures."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from tests.pgoutput_capture import __doc__ as DOC
from tests.pgoutput_capture import protocol_scenarios, row_scenarios
from tests.pgoutput_capture.capture import DB, OUT, Capture, Scenario, types_of, write_bin

SCENARIOS: dict[str, Scenario] = {
    "insert": row_scenarios.sc_insert,
    "update_delete": row_scenarios.sc_update_delete,
    "identity_full": row_scenarios.sc_identity_full,
    "toast": row_scenarios.sc_toast,
    "truncate": row_scenarios.sc_truncate,
    "type": row_scenarios.sc_type,
    "message": protocol_scenarios.sc_message,
    "origin": protocol_scenarios.sc_origin,
    "binary": row_scenarios.sc_binary,
    "stream": protocol_scenarios.sc_stream,
    "two_phase": protocol_scenarios.sc_two_phase,
}


def main(argv: list[str] | None = None) -> int:
    """Capture every scenario into ``--out``: one .bin per scenario and manifest.json."""
    ap = argparse.ArgumentParser(
        prog="python -m tests.pgoutput_capture",
        description=DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--dsn", required=True, help="libpq DSN of a superuser on a throwaway server")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB)))
        admin.execute(
            sql.SQL("CREATE DATABASE {} ENCODING 'UTF8' TEMPLATE template0").format(
                sql.Identifier(DB)
            )
        )
        version = admin.execute("SHOW server_version").fetchone()
    c = Capture(args.dsn)
    c.q(row_scenarios.WIDE_TABLE)
    c.q("CREATE PUBLICATION pub FOR ALL TABLES")
    manifest: dict[str, Any] = {
        "server_version": version[0] if version else None,
        "format": "each message: 4-byte big-endian length, then the pgoutput bytes",
        "scenarios": {},
    }
    for name, scenario in SCENARIOS.items():
        stmts, opts, rows, expected = scenario(c)
        if len(rows) != len(expected):
            raise SystemExit(f"scenario {name}: {len(rows)} messages but {len(expected)} expected")
        write_bin(out, name, rows)
        manifest["scenarios"][name] = {
            "doc": (scenario.__doc__ or "").strip(),
            "sql": stmts,
            "options": opts,
            "file": f"{name}.bin",
            "messages": [
                {"slot_lsn": lsn, "slot_xid": xid, **e}
                for (lsn, xid, _), e in zip(rows, expected, strict=True)
            ],
        }
        print(f"{name}: {len(rows)} messages ({types_of(rows)[:60]})")
    c.conn.close()
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(DB)))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
