"""What the reader takes for a change of a table's shape, and what it does then (issue 38).
The real-server run is tests/integration/incremental/test_schema_changes.py."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any, cast

import pytest

from cdc.incremental.engine import IncrementalSnapshots
from cdc.incremental.merge import ReadSnapshot
from cdc.incremental.queue import SnapshotsState, TableSnapshot
from cdc.incremental.requests import EngineConfig, Requests
from cdc.incremental.worker import ChunkRequest
from cdc.schema_changes import Shape, describe, published_shapes, shape
from schemas.model import Column, PgType, TableSchema

pytestmark = pytest.mark.unit

INT4 = PgType(23, "int4", "b")
TEXT = PgType(25, "text", "b")
VARCHAR = PgType(1043, "varchar", "b")


def _table(*columns: tuple[str, PgType, int]) -> TableSchema:
    cols = tuple(Column(n, t, m, optional=n != "id", part_of_key=n == "id") for n, t, m in columns)
    return TableSchema("public", "items", cols, ("id",), "d")


def test_the_shape_is_columns_types_and_modifiers_in_order() -> None:
    t = _table(("id", INT4, -1), ("name", VARCHAR, 24))
    assert shape(t) == [["id", "int4", -1], ["name", "varchar", 24]]


@pytest.mark.parametrize(
    ("before", "after", "said"),
    [
        (
            [["id", "int4", -1], ["qty", "int4", -1]],
            [["id", "int4", -1], ["qty", "text", -1]],
            "qty int4 -> text",
        ),
        (
            [["id", "int4", -1], ["n", "varchar", 14]],
            [["id", "int4", -1], ["n", "varchar", 24]],
            "n varchar(14) -> varchar(24)",
        ),
        ([["id", "int4", -1], ["name", "text", -1]], [["id", "int4", -1]], "name dropped"),
        (
            [["id", "int4", -1], ["qty", "text", -1]],
            [["id", "int4", -1], ["amount", "text", -1]],
            "qty dropped; amount added",
        ),
        (
            [["a", "int4", -1], ["b", "int4", -1]],
            [["b", "int4", -1], ["a", "int4", -1]],
            "columns reordered",
        ),
    ],
)
def test_what_changed_is_said_in_one_line(before: Any, after: Any, said: str) -> None:
    assert describe(before, after) == said


def test_the_recorded_shapes_round_trip() -> None:
    state = SnapshotsState(
        captured=[("public", "items")], relations={"public.items": [["id", "int4", -1]]}
    )
    assert SnapshotsState.from_json(state.to_json()).relations == {
        "public.items": [["id", "int4", -1]]
    }
    # A record written before shapes were kept has none.
    assert SnapshotsState.from_json(b'{"captured": null, "queue": [], "seen": {}}').relations == {}


def _requests(state: SnapshotsState, **config: Any) -> Requests:
    # schema_changed asks neither the catalog nor the signal intake.
    return Requests(
        EngineConfig("p", "pub", **config), state, cast(Any, None), cast(Any, None), lambda s: None
    )


def test_a_changed_table_is_snapshotted_again_from_its_first_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A snapshot of it under way (rows published in the old shape) is replaced; others stay.
    running = TableSnapshot("old", "public", "items", last_key=["40"], chunks=2, rows=80)
    other = TableSnapshot("x", "public", "other")
    state = SnapshotsState(queue=[running, other])
    with caplog.at_level(logging.WARNING):
        _requests(state).schema_changed(("public", "items"), "qty int4 -> text")
    assert [(s.key, s.via, s.last_key) for s in state.queue] == [
        (("public", "other"), "signal", None),
        (("public", "items"), "schema_change", None),
    ]
    assert "table public.items changed (qty int4 -> text): snapshotting it again" in caplog.text


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"snapshot_on_schema_change": False}, "postgres.snapshot_on_schema_change is off"),
        ({"on_standby": True}, "a reader on a standby cannot snapshot it again"),
    ],
)
def test_when_it_cannot_be_snapshotted_the_line_says_the_way_past(
    config: dict[str, Any], said: str, caplog: pytest.LogCaptureFixture
) -> None:
    state = SnapshotsState()
    with caplog.at_level(logging.WARNING):
        _requests(state, **config).schema_changed(("public", "items"), "name dropped")
    assert state.queue == []
    assert said in caplog.text
    assert "`cdc snapshot public.items` (on the primary) publishes every row" in caplog.text


def test_the_signal_table_is_not_snapshotted() -> None:
    state = SnapshotsState()
    _requests(state, signal_table=("public", "items")).schema_changed(("public", "items"), "x")
    assert state.queue == []


class _OneTable:
    """The engine's catalog: one published table, whose columns are ``columns`` now (read by
    published_shapes, from the rows its query returns)."""

    def __init__(self, table: tuple[str, str], columns: list[list[Any]]) -> None:
        self.table, self.rows = table, [(*table, *c) for c in columns]

    def execute(self, query: str, params: Any) -> _OneTable:
        return self

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows

    def captured(self) -> list[tuple[str, str]]:
        return [self.table]

    def shapes(self) -> dict[str, Shape]:
        return published_shapes(cast(Any, self), "pub", False)

    def visibility(self) -> ReadSnapshot:
        return ReadSnapshot(frozenset(), 1)

    def committed_invisible(self) -> frozenset[int]:
        return frozenset()

    def close(self) -> None:
        pass


class _NoSignals:
    def poll_topic(self) -> list[Any]:
        return []

    def commit_topic(self) -> None:
        pass

    def recheck_table(self) -> None:
        pass


class _Chunks:
    def __init__(self) -> None:
        self.asked: list[ChunkRequest] = []

    def submit(self, request: ChunkRequest) -> Future[Any]:
        self.asked.append(request)
        return Future()  # never read: the test looks at what was asked


def test_a_shape_change_the_catalog_shows_snapshots_the_table_with_dots_in_its_names() -> None:
    # The shapes are keyed by the table's name as the one rule writes it, and read back by it:
    # my.schema.my.table cut at its first dot would snapshot ("my", "schema.my.table").
    table = ("my.schema", "my.table")
    old, new = [["id", "int4", -1]], [["id", "int4", -1], ["n", "text", -1]]
    state = SnapshotsState(captured=[table], relations={'"my.schema"."my.table"': old})
    chunks = _Chunks()
    engine = IncrementalSnapshots(
        EngineConfig("p", "pub"),
        state=state,
        save=lambda s: None,
        chunks=chunks,
        publisher=cast(Any, None),
        catalog=_OneTable(table, new),
        intake=cast(Any, _NoSignals()),
    )
    engine.tick(0.0)
    assert [s.key for s in state.queue] == [table]
    assert [(r.schema, r.table) for r in chunks.asked] == [table]
    assert state.relations == {'"my.schema"."my.table"': new}


def test_the_command_it_suggests_names_a_dotted_table_so_that_it_reads_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        _requests(SnapshotsState(), snapshot_on_schema_change=False).schema_changed(
            ("my.schema", "items"), "name dropped"
        )
    assert '`cdc snapshot "my.schema".items` (on the primary)' in caplog.text
