"""The demo's sample database: schema from demo/schema.sql, rows generated with a fixed seed.

Realistic enough to exercise the pipeline: foreign keys with cascades, a composite primary key
on a REPLICA IDENTITY FULL table, numerics and timestamps, and product descriptions of which
some are > 8 kB of incompressible text, so PostgreSQL stores them out of line (TOAST).
"""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

SCHEMA_SQL = Path(__file__).with_name("schema.sql")

# The word the running search query looks for; the workload adds it to and removes it from
# titles, so the query's results visibly change.
SEARCH_WORD = "waterproof"
# The category whose products the screen finds by its name among the joined documents.
DOCUMENTS_CATEGORY = "Lamps"

TABLES = ("public.categories", "public.products", "public.stock_levels", "public.customers")
# Primary-key columns in index order: the followers' document ids are built from these.
KEYS = {
    "public.categories": ("id",),
    "public.products": ("id",),
    "public.stock_levels": ("product_id", "warehouse"),
    "public.customers": ("id",),
}
WAREHOUSES = ("AMS", "BER", "LIS", "WAW")

_CATEGORIES = {
    "Outdoor": ("Tents", "Backpacks", "Rain gear"),
    "Kitchen": ("Kettles", "Knives", "Cookware"),
    "Audio": ("Headphones", "Speakers"),
    "Home": ("Lamps", "Chairs", "Bedding"),
    "Sports": ("Running", "Cycling", "Swimming"),
}
_ADJECTIVES = (
    "lightweight", "ergonomic", "stainless", "wireless", "organic", "compact", "insulated",
    "foldable", "rugged", "classic", "breathable", "noise-cancelling", "recycled", "heated",
)  # fmt: skip
_NOUNS = (
    "jacket", "backpack", "kettle", "headphones", "tent", "bottle", "lamp", "chair", "speaker",
    "knife", "pan", "blanket", "shoes", "helmet", "goggles", "boots", "gloves", "duffel bag",
)  # fmt: skip
_COLORS = ("black", "olive", "navy", "sand", "red", "graphite", "white")
_CITIES = ("Amsterdam", "Berlin", "Lisbon", "Warsaw", "Lyon", "Porto", "Gdansk", "Utrecht")
_FIRST = ("Ada", "Ben", "Chloe", "Dara", "Emil", "Fay", "Goran", "Hana", "Ivo", "Jana", "Kai")
_LAST = ("Novak", "Jansen", "Silva", "Weber", "Kowalski", "Costa", "Meyer", "de Vries")


@dataclass(frozen=True)
class SampleSize:
    products: int = 1500
    customers: int = 2500
    big_every: int = 8  # every n-th product gets a > 8 kB description


def product_title(rnd: random.Random) -> str:
    words = [rnd.choice(_ADJECTIVES), rnd.choice(_COLORS), rnd.choice(_NOUNS)]
    if rnd.random() < 0.12:
        words.insert(0, SEARCH_WORD)
    return " ".join(words).capitalize()


def product_description(rnd: random.Random, title: str, big: bool) -> str:
    """A readable paragraph; ``big`` adds ~9-12 kB of random batch codes.

    Random base64 has no repeats for pglz to exploit, so the value stays incompressible and
    is stored out of line rather than compressed inline.
    """
    text = (
        f"{title}. {rnd.choice(_ADJECTIVES).capitalize()} design for everyday use, "
        f"made from {rnd.choice(('recycled nylon', 'steel', 'cotton', 'aluminium', 'oak'))}. "
        f"Ships from {rnd.choice(_CITIES)}."
    )
    if big:
        raw = base64.b64encode(rnd.randbytes(rnd.randint(7000, 9000))).decode()
        codes = " ".join(raw[i : i + 16] for i in range(0, len(raw), 16))
        text += " Batch codes: " + codes
    return text


def customer_row(rnd: random.Random, i: int) -> tuple[object, ...]:
    first, last = rnd.choice(_FIRST), rnd.choice(_LAST)
    email = f"{first}.{last}.{i}@example.com".lower().replace(" ", "")
    return (i, email, f"{first} {last}", rnd.choice(_CITIES), rnd.randint(0, 5000))


def create_database(admin_dsn: str, name: str) -> None:
    """Create the (empty) database ``name``; it must not exist."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


def load(dsn: str, size: SampleSize = SampleSize(), seed: int = 6) -> dict[str, int]:
    """Create the schema and load the rows; returns row counts per table."""
    rnd = random.Random(seed)
    with psycopg.connect(dsn) as conn:
        conn.execute(SCHEMA_SQL.read_text())
        with conn.cursor() as cur:
            cat_ids: list[int] = []
            with cur.copy("COPY categories (id, name, parent_id) FROM STDIN") as cp:
                next_id = 1
                for parent, children in _CATEGORIES.items():
                    parent_id = next_id
                    cp.write_row((parent_id, parent, None))
                    next_id += 1
                    for child in children:
                        cp.write_row((next_id, child, parent_id))
                        cat_ids.append(next_id)
                        next_id += 1
            with cur.copy(
                "COPY products (id, sku, category_id, title, description, price, active) FROM STDIN"
            ) as cp:
                for i in range(1, size.products + 1):
                    title = product_title(rnd)
                    cp.write_row(
                        (
                            i,
                            f"SKU-{i:06d}",
                            rnd.choice(cat_ids),
                            title,
                            product_description(rnd, title, i % size.big_every == 0),
                            f"{rnd.randint(299, 49999) / 100:.2f}",
                            rnd.random() < 0.95,
                        )
                    )
            with cur.copy(
                "COPY stock_levels (product_id, warehouse, quantity, reserved) FROM STDIN"
            ) as cp:
                for i in range(1, size.products + 1):
                    for wh in rnd.sample(WAREHOUSES, rnd.randint(2, 4)):
                        cp.write_row((i, wh, rnd.randint(0, 500), rnd.randint(0, 5)))
            with cur.copy(
                "COPY customers (id, email, name, city, loyalty_points) FROM STDIN"
            ) as cp:
                for i in range(1, size.customers + 1):
                    cp.write_row(customer_row(rnd, i))
        conn.execute("ANALYZE")
        return row_counts(conn)


def row_counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    out = {}
    for t in TABLES:
        row = conn.execute(f"SELECT count(*) FROM {t}").fetchone()
        out[t] = int(row[0]) if row else 0
    return out


def toast_report(dsn: str) -> tuple[int, int]:
    """(products whose description is stored out of line uncompressed, TOAST table bytes)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM products WHERE octet_length(description) > 8000 "
            "        AND pg_column_size(description) >= octet_length(description)), "
            "       pg_relation_size((SELECT reltoastrelid FROM pg_class "
            "                         WHERE oid = 'products'::regclass))"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])
