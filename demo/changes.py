"""The demo's live changes to the catalog, as a mix for the workload generator.

Every kind of change the followers must handle appears: new products (some with large
descriptions), price updates that leave the TOASTed description untouched, new descriptions,
title changes that move products in and out of the search results, stock updates on the
REPLICA IDENTITY FULL table, cascading deletes, and primary-key changes that cascade into
the stock table's composite key.

Primary-key changes include products whose description is stored out of line: pgoutput sends
the new row with the description "unchanged TOAST", and the reader fills it in for the create
event of the new key (``toasted_key_changes=False`` leaves such products out).
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from typing import Any

import psycopg

from benchmarks.workload import LiveKeys, Pacing, ThreadedLoad
from demo.sample import SEARCH_WORD, WAREHOUSES, customer_row, product_description, product_title

# Change kinds and their weights per transaction step.
_KINDS = {
    "product_insert": 6,
    "price_update": 10,  # leaves the TOASTed description alone
    "title_toggle": 6,  # adds/removes the search word
    "description_update": 2,
    "stock_update": 14,
    "stock_delete": 2,
    "product_delete": 2,
    "product_key_change": 1,
    "customer_insert": 5,
    "customer_update": 6,
    "customer_delete": 1,
    "customer_key_change": 1,
}
_PRODUCT_UPDATES = ("price_update", "title_toggle", "description_update")


def live_changes(
    dsn: str, *, tx_per_s: float, seconds: float, toasted_key_changes: bool = True, seed: int = 66
) -> ThreadedLoad:
    """The demo's workload: about ``tx_per_s`` catalog transactions a second for ``seconds``
    (paced against the start, so slow commits do not lower the average rate). ``counts``
    tallies rows changed by kind: insert, update, delete, key change (cascades included)."""
    return ThreadedLoad(
        dsn,
        functools.partial(CatalogMix, toasted_key_changes=toasted_key_changes),
        pacing=Pacing(rate=tx_per_s, seconds=seconds, end_on_clock=True),
        seed=seed,
        name="demo-workload",
    )


class CatalogMix:
    """Transactions of 1..5 random catalog changes (the weights of ``_KINDS``)."""

    one_statement = False

    def __init__(self, worker: int, workers: int, *, toasted_key_changes: bool = True) -> None:
        self.toasted_key_changes = toasted_key_changes
        self.products: LiveKeys[int] = LiveKeys()
        self.big: set[int] = set()  # products whose description may be TOASTed
        self.stock: dict[int, set[str]] = {}  # product -> warehouses with a stock row
        self.customers: LiveKeys[int] = LiveKeys()
        self.next_product = self.next_customer = 0

    def prepare(self, conn: psycopg.Connection[Any]) -> None:
        """What the catalog holds now; new ids start well above the existing ones."""
        for (pid,) in conn.execute("SELECT id FROM products"):
            self.products.add(int(pid))
        self.big = {
            int(r[0])
            for r in conn.execute("SELECT id FROM products WHERE octet_length(description) > 2000")
        }
        for pid, wh in conn.execute("SELECT product_id, warehouse FROM stock_levels"):
            self.stock.setdefault(int(pid), set()).add(str(wh))
        for (cid,) in conn.execute("SELECT id FROM customers"):
            self.customers.add(int(cid))
        self.next_product = max(self.products, default=0) + 100_000
        self.next_customer = max(self.customers, default=0) + 100_000

    def committed(self, at: float) -> None:
        """Nothing to record: the counts are the whole result."""

    def write(self, conn: psycopg.Connection[Any], rnd: random.Random) -> Counter[str]:
        """1..5 changes of random kinds; rows changed by kind."""
        counts: Counter[str] = Counter()
        for kind in rnd.choices(list(_KINDS), list(_KINDS.values()), k=rnd.randint(1, 5)):
            if kind == "product_insert":
                self._product_insert(conn, rnd, counts)
            elif kind == "customer_insert":
                self._customer_insert(conn, rnd, counts)
            elif kind.startswith("product") or kind in _PRODUCT_UPDATES:
                self._product_change(conn, rnd, kind, counts)
            elif kind in ("stock_update", "stock_delete"):
                self._stock_change(conn, rnd, kind, counts)
            else:
                self._customer_change(conn, rnd, kind, counts)
        return counts

    def _product_insert(
        self, conn: psycopg.Connection[Any], rnd: random.Random, counts: Counter[str]
    ) -> None:
        pid, self.next_product = self.next_product, self.next_product + 1
        title = product_title(rnd)
        conn.execute(
            "INSERT INTO products (id, sku, category_id, title, description, price)"
            " VALUES (%s, %s, (SELECT min(id) + %s FROM categories"
            " WHERE parent_id IS NOT NULL), %s, %s, %s)",
            (
                pid,
                f"SKU-{pid:06d}",
                rnd.randint(0, 3),
                title,
                product_description(rnd, title, rnd.random() < 0.2),
                f"{rnd.randint(299, 49999) / 100:.2f}",
            ),
        )
        self.products.add(pid)
        self.big.add(pid)  # whether or not it got a long description
        whs = set(rnd.sample(WAREHOUSES, 2))
        for wh in whs:
            conn.execute(
                "INSERT INTO stock_levels (product_id, warehouse, quantity) VALUES (%s, %s, %s)",
                (pid, wh, rnd.randint(1, 100)),
            )
        self.stock[pid] = whs
        counts["insert"] += 1 + len(whs)

    def _customer_insert(
        self, conn: psycopg.Connection[Any], rnd: random.Random, counts: Counter[str]
    ) -> None:
        cid, self.next_customer = self.next_customer, self.next_customer + 1
        conn.execute(
            "INSERT INTO customers (id, email, name, city, loyalty_points) "
            "VALUES (%s, %s, %s, %s, %s)",
            customer_row(rnd, cid),
        )
        self.customers.add(cid)
        counts["insert"] += 1

    def _product_change(
        self, conn: psycopg.Connection[Any], rnd: random.Random, kind: str, counts: Counter[str]
    ) -> None:
        if not self.products:
            return
        pid = self.products.pick(rnd)
        if kind == "product_key_change" and pid in self.big and not self.toasted_key_changes:
            return
        if kind == "price_update":
            conn.execute(
                "UPDATE products SET price = price + 0.10, updated_at = now() WHERE id = %s",
                (pid,),
            )
        elif kind == "title_toggle":
            # Words stay separate tokens: strip or prepend the search word.
            conn.execute(
                "UPDATE products SET title = CASE WHEN title ILIKE %s "
                "THEN initcap(trim(regexp_replace(title, %s, '', 'i'))) "
                "ELSE %s || ' ' || lower(title) END, updated_at = now() "
                "WHERE id = %s",
                (f"%{SEARCH_WORD}%", SEARCH_WORD, SEARCH_WORD.capitalize(), pid),
            )
        elif kind == "description_update":
            conn.execute(
                "UPDATE products SET description = %s WHERE id = %s",
                (product_description(rnd, product_title(rnd), True), pid),
            )
            self.big.add(pid)
        elif kind == "product_delete":
            conn.execute("DELETE FROM products WHERE id = %s", (pid,))
            self.products.discard(pid)
            self.big.discard(pid)
            counts["delete"] += 1 + len(self.stock.pop(pid, ()))  # stock rows cascade
            return
        else:  # product_key_change, cascades into stock_levels' key
            new, self.next_product = self.next_product, self.next_product + 1
            conn.execute("UPDATE products SET id = %s WHERE id = %s", (new, pid))
            self.products.replace(pid, new)
            if pid in self.big:
                self.big.discard(pid)
                self.big.add(new)
            self.stock[new] = self.stock.pop(pid, set())
            counts["key change"] += 1 + len(self.stock[new])
            return
        counts["update"] += 1

    def _stock_change(
        self, conn: psycopg.Connection[Any], rnd: random.Random, kind: str, counts: Counter[str]
    ) -> None:
        if not self.stock:
            return
        pid = rnd.choice(tuple(self.stock))
        if not self.stock[pid]:
            return
        wh = rnd.choice(sorted(self.stock[pid]))
        if kind == "stock_update":
            conn.execute(
                "UPDATE stock_levels SET quantity = %s, reserved = %s, "
                "updated_at = now() WHERE product_id = %s AND warehouse = %s",
                (rnd.randint(0, 500), rnd.randint(0, 5), pid, wh),
            )
            counts["update"] += 1
        else:
            conn.execute(
                "DELETE FROM stock_levels WHERE product_id = %s AND warehouse = %s", (pid, wh)
            )
            self.stock[pid].discard(wh)
            counts["delete"] += 1

    def _customer_change(
        self, conn: psycopg.Connection[Any], rnd: random.Random, kind: str, counts: Counter[str]
    ) -> None:
        if not self.customers:
            return
        cid = self.customers.pick(rnd)
        if kind == "customer_update":
            conn.execute(
                "UPDATE customers SET loyalty_points = loyalty_points + %s, city = %s "
                "WHERE id = %s",
                (rnd.randint(1, 50), rnd.choice(("Lyon", "Porto", "Gdansk")), cid),
            )
            counts["update"] += 1
        elif kind == "customer_delete":
            conn.execute("DELETE FROM customers WHERE id = %s", (cid,))
            self.customers.discard(cid)
            counts["delete"] += 1
        else:
            new, self.next_customer = self.next_customer, self.next_customer + 1
            conn.execute("UPDATE customers SET id = %s WHERE id = %s", (new, cid))
            self.customers.replace(cid, new)
            counts["key change"] += 1
