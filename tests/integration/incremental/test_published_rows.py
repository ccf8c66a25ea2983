"""A snapshot reads what the publication publishes as the table (issue 34, finding 3): an
inheritance child's rows are not the parent's, a partitioned table published through its
root is read whole, in the initial snapshot and in incremental chunks alike."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.conftest import Endpoints
from tests.integration.incremental.support import Reader, cdc, pipeline, topic

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE parent (id int PRIMARY KEY, v text);
CREATE TABLE child (extra text) INHERITS (parent);
INSERT INTO parent SELECT i, 'p' || i FROM generate_series(1, 5) i;
INSERT INTO child SELECT i, 'c' || i, 'x' FROM generate_series(101, 105) i;
CREATE TABLE pt (id int PRIMARY KEY, v text) PARTITION BY RANGE (id);
CREATE TABLE pt_low PARTITION OF pt FOR VALUES FROM (0) TO (100);
CREATE TABLE pt_high PARTITION OF pt FOR VALUES FROM (100) TO (1000);
INSERT INTO pt SELECT i, 'pt' || i FROM generate_series(1, 200, 7) i;
"""


def _keys(p: object, table: str, op: str | None = None) -> set[int]:
    return {
        int(r.payload["after"]["id"])
        for r in topic(p, table)  # type: ignore[arg-type]
        if r.payload is not None and (op is None or r.payload["op"] == op)
    }


def test_an_inheritance_child_is_not_read_as_its_parent_and_a_partition_root_is_read_whole(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    with pipeline(endpoints, tmp_path, "published_rows") as p:
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            # The DBA's publication: the parent alone, the partitioned table through its root.
            conn.execute(
                f'CREATE PUBLICATION "{p.name}" FOR TABLE ONLY parent, pt '
                "WITH (publish_via_partition_root = true)"
            )
            in_pt = {r[0] for r in conn.execute("SELECT id FROM pt").fetchall()}
        reader = Reader(
            p, tmp_path / "reader.log", CDC_POSTGRES__PUBLICATION_AUTOCREATE_MODE="disabled"
        )
        reader.catch_up()  # the initial snapshot
        assert _keys(p, "public.parent") == set(range(1, 6))
        assert _keys(p, "public.pt") == in_pt and len(in_pt) > 20

        for table in ("public.parent", "public.pt"):
            out = cdc(p, "snapshot", table)
            assert out.returncode == 0, out.stderr
        reader.catch_up()  # the incremental snapshots, in chunks
        text = reader.text()
        assert "incremental snapshot of public.parent complete: 5 rows" in text, reader.tail()
        assert f"incremental snapshot of public.pt complete: {len(in_pt)} rows" in text
        assert _keys(p, "public.parent", "r") == set(range(1, 6))
        assert _keys(p, "public.pt") == in_pt
