"""The demo's live workload: inserts, updates, deletes and primary-key changes, paced.

Runs in a thread beside the screen. Every kind of change the followers must handle appears:
new products (some with large descriptions), price updates that leave the TOASTed description
untouched, new descriptions, title changes that move products in and out of the search
results, stock updates on the REPLICA IDENTITY FULL table, cascading deletes, and primary-key
changes that cascade into the stock table's composite key.

Primary-key changes include products whose description is stored out of line: pgoutput sends
the new row with the description "unchanged TOAST", and the reader fills it in for the create
event of the new key (``toasted_key_changes=False`` leaves such products out).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from typing import Any

import psycopg

from demo.sample import SEARCH_WORD, WAREHOUSES, customer_row, product_description, product_title

log = logging.getLogger(__name__)

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


class LiveWorkload:
    """Apply random catalog changes at about ``tx_per_s`` transactions per second.

    ``counts`` tallies statements by kind (SQL operation), readable while running.
    """

    def __init__(
        self,
        dsn: str,
        *,
        tx_per_s: float = 25.0,
        seed: int = 66,
        toasted_key_changes: bool = True,
    ) -> None:
        self.dsn = dsn
        self.toasted_key_changes = toasted_key_changes
        self.tx_per_s = tx_per_s
        self.rnd = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.transactions = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, duration_s: float) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(duration_s,), name="demo-workload", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self, duration_s: float) -> None:
        try:
            with psycopg.connect(self.dsn) as conn:
                self._loop(conn, duration_s)
        except BaseException as e:  # reported on the screen and fails the demo
            log.exception("workload failed")
            self.error = e

    def _loop(self, conn: psycopg.Connection[Any], duration_s: float) -> None:
        rnd = self.rnd
        products = {int(r[0]) for r in conn.execute("SELECT id FROM products")}
        # Products whose description may be TOASTed (see the module docstring).
        big = {
            int(r[0])
            for r in conn.execute("SELECT id FROM products WHERE octet_length(description) > 2000")
        }
        stock: dict[int, set[str]] = {}
        for pid, wh in conn.execute("SELECT product_id, warehouse FROM stock_levels"):
            stock.setdefault(int(pid), set()).add(str(wh))
        customers = {int(r[0]) for r in conn.execute("SELECT id FROM customers")}
        next_product = max(products, default=0) + 100_000
        next_customer = max(customers, default=0) + 100_000
        conn.commit()
        kinds, weights = list(_KINDS), list(_KINDS.values())
        start = time.monotonic()
        end = start + duration_s
        while not self._stop.is_set() and time.monotonic() < end:
            with conn.transaction():
                for kind in rnd.choices(kinds, weights, k=rnd.randint(1, 5)):
                    if kind == "product_insert":
                        pid, next_product = next_product, next_product + 1
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
                        products.add(pid)
                        big.add(pid)  # whether or not it got a long description
                        whs = set(rnd.sample(WAREHOUSES, 2))
                        for wh in whs:
                            conn.execute(
                                "INSERT INTO stock_levels (product_id, warehouse, quantity) "
                                "VALUES (%s, %s, %s)",
                                (pid, wh, rnd.randint(1, 100)),
                            )
                        stock[pid] = whs
                        self.counts["insert"] += 1 + len(whs)
                    elif kind == "customer_insert":
                        cid, next_customer = next_customer, next_customer + 1
                        conn.execute(
                            "INSERT INTO customers (id, email, name, city, loyalty_points) "
                            "VALUES (%s, %s, %s, %s, %s)",
                            customer_row(rnd, cid),
                        )
                        customers.add(cid)
                        self.counts["insert"] += 1
                    elif kind.startswith("product") or kind in (
                        "price_update",
                        "title_toggle",
                        "description_update",
                    ):
                        if not products:
                            continue
                        pid = rnd.choice(tuple(products))
                        if (
                            kind == "product_key_change"
                            and pid in big
                            and not self.toasted_key_changes
                        ):
                            continue
                        if kind == "price_update":
                            conn.execute(
                                "UPDATE products SET price = price + 0.10, updated_at = now() "
                                "WHERE id = %s",
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
                            big.add(pid)
                        elif kind == "product_delete":
                            conn.execute("DELETE FROM products WHERE id = %s", (pid,))
                            products.discard(pid)
                            big.discard(pid)
                            self.counts["delete"] += len(stock.pop(pid, ()))  # cascaded
                            self.counts["delete"] += 1
                            continue
                        else:  # product_key_change, cascades into stock_levels' key
                            new, next_product = next_product, next_product + 1
                            conn.execute("UPDATE products SET id = %s WHERE id = %s", (new, pid))
                            products.discard(pid)
                            products.add(new)
                            if pid in big:
                                big.discard(pid)
                                big.add(new)
                            stock[new] = stock.pop(pid, set())
                            self.counts["key change"] += 1 + len(stock[new])
                            continue
                        self.counts["update"] += 1
                    elif kind in ("stock_update", "stock_delete"):
                        if not stock:
                            continue
                        pid = rnd.choice(tuple(stock))
                        if not stock[pid]:
                            continue
                        wh = rnd.choice(sorted(stock[pid]))
                        if kind == "stock_update":
                            conn.execute(
                                "UPDATE stock_levels SET quantity = %s, reserved = %s, "
                                "updated_at = now() WHERE product_id = %s AND warehouse = %s",
                                (rnd.randint(0, 500), rnd.randint(0, 5), pid, wh),
                            )
                            self.counts["update"] += 1
                        else:
                            conn.execute(
                                "DELETE FROM stock_levels WHERE product_id = %s AND warehouse = %s",
                                (pid, wh),
                            )
                            stock[pid].discard(wh)
                            self.counts["delete"] += 1
                    else:
                        if not customers:
                            continue
                        cid = rnd.choice(tuple(customers))
                        if kind == "customer_update":
                            conn.execute(
                                "UPDATE customers SET loyalty_points = loyalty_points + %s, "
                                "city = %s WHERE id = %s",
                                (rnd.randint(1, 50), rnd.choice(("Lyon", "Porto", "Gdansk")), cid),
                            )
                            self.counts["update"] += 1
                        elif kind == "customer_delete":
                            conn.execute("DELETE FROM customers WHERE id = %s", (cid,))
                            customers.discard(cid)
                            self.counts["delete"] += 1
                        else:
                            new, next_customer = next_customer, next_customer + 1
                            conn.execute("UPDATE customers SET id = %s WHERE id = %s", (new, cid))
                            customers.discard(cid)
                            customers.add(new)
                            self.counts["key change"] += 1
            self.transactions += 1
            # Pace against the start time, so slow commits do not lower the average rate.
            ahead = start + self.transactions / self.tx_per_s - time.monotonic()
            if ahead > 0:
                self._stop.wait(ahead)
