"""The incremental join (spark_jobs.join) against the same documents computed at once from
the final tables: random workloads over products, categories and stock levels, their
changes delivered as Kafka would (each key's in order, the topics interleaved at random, a
suffix of a partition read again after a "restart", truncates on a partition of their own),
and a follower that writes each touched document with ``external_gte``."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest

from spark_jobs.join import (
    Aggregate,
    DocumentSpec,
    JoinChange,
    JoinState,
    Lookup,
    Nested,
    Truncate,
)

pytestmark = pytest.mark.unit

SPEC = DocumentSpec(
    root="products",
    root_key="id",
    fields=("id", "name", "category_id"),
    lookups=(Lookup("category", "categories", on="category_id", key="id", fields=("name",)),),
    nested=(
        Nested(
            "stock",
            "stock_levels",
            on="product_id",
            fields=("warehouse", "quantity"),
            aggregates=(
                Aggregate("total_stock", "sum", "quantity"),
                Aggregate("warehouses", "count", "warehouse"),
                Aggregate("least", "min", "quantity"),
                Aggregate("most", "max", "quantity"),
            ),
        ),
    ),
)
Event = JoinChange | Truncate
Tables = dict[str, dict[Any, dict[str, Any]]]


def _workload(rng: random.Random, txns: int) -> tuple[list[Event], Tables]:
    """Committed changes in commit order, and the tables they leave."""
    tables: Tables = {"products": {}, "categories": {}, "stock_levels": {}}
    log: list[Event] = []
    for lsn in range(1, txns + 1):
        for order in range(rng.randint(1, 3)):
            version = (lsn * 10, order)
            table = rng.choice(
                ("products", "products", "categories", "stock_levels", "stock_levels")
            )
            if rng.random() < 0.02:
                tables[table].clear()
                log.append(Truncate(table, version))
                continue
            key = rng.randint(1, {"products": 8, "categories": 4, "stock_levels": 12}[table])
            if rng.random() < 0.25:
                tables[table].pop(key, None)
                log.append(JoinChange(table, (key,), version, None))
                continue
            if table == "products":
                row = {"id": key, "name": f"p{key}-{lsn}", "category_id": rng.randint(1, 5)}
            elif table == "categories":
                row = {"id": key, "name": f"c{key}-{lsn}"}
            else:
                row = {
                    "id": key,
                    "product_id": rng.randint(1, 9),  # 9: a product that never exists
                    "warehouse": rng.choice("abc"),
                    "quantity": rng.choice((None, *range(10))),
                }
            tables[table][key] = row
            log.append(JoinChange(table, (key,), version, row))
    return log, tables


def _oracle(tables: Tables) -> dict[Any, dict[str, Any]]:
    """The join computed from the final tables, as PostgreSQL's query would."""
    docs = {}
    for pid, p in tables["products"].items():
        category = tables["categories"].get(p["category_id"])
        stock = [s for k, s in sorted(tables["stock_levels"].items()) if s["product_id"] == pid]
        quantities = [s["quantity"] for s in stock if s["quantity"] is not None]
        docs[pid] = {
            "id": pid,
            "name": p["name"],
            "category_id": p["category_id"],
            "category": None if category is None else {"name": category["name"]},
            "stock": [{"warehouse": s["warehouse"], "quantity": s["quantity"]} for s in stock],
            "total_stock": sum(quantities),
            "warehouses": len(stock),
            "least": min(quantities, default=None),
            "most": max(quantities, default=None),
        }
    return docs


def _deliveries(rng: random.Random, log: list[Event]) -> list[Event]:
    """The log as a consumer reads it: a partition per key (and one for each table's
    truncates), interleaved at random, and now and then a partition read again from an
    earlier offset (at-least-once after a restart)."""
    partitions: dict[tuple[Any, ...], list[Event]] = defaultdict(list)
    for e in log:
        where = (e.table, "truncate") if isinstance(e, Truncate) else (e.table, e.key)
        partitions[where].append(e)
    queues = [list(q) for q in partitions.values()]
    read = [0] * len(queues)
    out: list[Event] = []
    while any(r < len(q) for r, q in zip(read, queues, strict=True)):
        i = rng.choice([i for i, q in enumerate(queues) if read[i] < len(q)])
        out.append(queues[i][read[i]])
        read[i] += 1
        if rng.random() < 0.05:
            read[i] = rng.randint(0, read[i])  # read again from an earlier offset
    return out


def _run(seed: int) -> tuple[dict[Any, dict[str, Any]], dict[Any, dict[str, Any]], int]:
    rng = random.Random(seed)
    log, tables = _workload(rng, rng.randint(5, 60))
    state = JoinState(SPEC)
    follower: dict[Any, tuple[int, dict[str, Any] | None]] = {}
    sent: dict[Any, list[tuple[int, dict[str, Any] | None]]] = defaultdict(list)
    refused = 0

    def write(doc_id: Any, version: int, doc: dict[str, Any] | None) -> bool:
        held = follower.get(doc_id)
        if held is not None and version < held[0]:
            return False  # external_gte refuses it
        follower[doc_id] = (version, doc)
        return True

    for event in _deliveries(rng, log):
        for doc_id in state.apply(event):
            version, doc = state.document(doc_id)
            if not write(doc_id, version, doc):
                refused += 1  # a fresh write refused: the follower would go backwards
            sent[doc_id].append((version, doc))
            if rng.random() < 0.1:
                write(doc_id, *rng.choice(sent[doc_id]))  # an earlier request sent again
    got = {d: doc for d, (_, doc) in follower.items() if doc is not None}
    return got, _oracle(tables), refused


@pytest.mark.parametrize("block", range(10))
def test_the_incremental_join_equals_the_join_of_the_final_tables(block: int) -> None:
    for seed in range(block * 100, block * 100 + 100):
        got, want, refused = _run(seed)
        assert refused == 0, seed
        assert got == want, seed


def _doc(state: JoinState, doc_id: Any) -> dict[str, Any]:
    doc = state.document(doc_id)[1]
    assert doc is not None
    return doc


def test_a_late_lookup_a_move_and_a_replay_are_each_taken() -> None:
    """The cases by hand: the category arrives after its product; a stock level moves to
    another product (both documents change); a replayed older change touches nothing."""
    state = JoinState(SPEC)
    assert state.apply(
        JoinChange("products", (1,), (10, 0), {"id": 1, "name": "a", "category_id": 7})
    ) == {1}
    assert _doc(state, 1)["category"] is None
    assert state.apply(JoinChange("categories", (7,), (5, 0), {"id": 7, "name": "tools"})) == {1}
    assert state.document(1) == (2, {**_doc(state, 1), "category": {"name": "tools"}})
    state.apply(JoinChange("products", (2,), (11, 0), {"id": 2, "name": "b", "category_id": 7}))
    stock = {"id": 3, "product_id": 1, "warehouse": "w", "quantity": 4}
    assert state.apply(JoinChange("stock_levels", (3,), (12, 0), stock)) == {1}
    assert state.apply(JoinChange("stock_levels", (3,), (13, 0), {**stock, "product_id": 2})) == {
        1,
        2,
    }
    assert _doc(state, 1)["stock"] == [] and _doc(state, 2)["total_stock"] == 4
    # A category renamed touches every product in it; the old change read again, nothing.
    assert state.apply(JoinChange("categories", (7,), (14, 0), {"id": 7, "name": "gear"})) == {1, 2}
    assert state.apply(JoinChange("categories", (7,), (5, 0), {"id": 7, "name": "tools"})) == set()
    assert _doc(state, 2)["category"] == {"name": "gear"}


def test_a_category_left_behind_no_longer_touches_the_product() -> None:
    state = JoinState(SPEC)
    state.apply(JoinChange("products", (1,), (10, 0), {"id": 1, "name": "a", "category_id": 7}))
    state.apply(JoinChange("products", (1,), (11, 0), {"id": 1, "name": "a", "category_id": 8}))
    assert state.apply(JoinChange("categories", (7,), (12, 0), {"id": 7, "name": "x"})) == set()
    assert state.apply(JoinChange("categories", (8,), (13, 0), {"id": 8, "name": "y"})) == {1}


def test_an_older_truncate_read_again_does_not_let_a_truncated_row_back() -> None:
    state = JoinState(SPEC)
    row = {"id": 1, "name": "a", "category_id": 7}
    state.apply(Truncate("products", (10, 0)))
    state.apply(JoinChange("products", (1,), (15, 0), row))
    state.apply(Truncate("products", (20, 0)))
    assert state.document(1)[1] is None
    assert state.apply(Truncate("products", (10, 0))) == set()  # read again after a restart
    assert state.apply(JoinChange("products", (1,), (15, 0), row)) == set()
    assert state.document(1)[1] is None
