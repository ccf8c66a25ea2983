"""The demo catalog's joined document (docs/documents.md: a product with its category and
its stock levels) and the same join computed by PostgreSQL: shared by the demo
(demo/documents.py), its end-to-end test and the fan-out benchmark
(benchmarks/documents_fanout.py), which import this package while it imports none of
theirs."""

from __future__ import annotations

from typing import Any

# As docs/documents.md declares it (CDC_SEARCH__DOCUMENTS takes this list as JSON).
DOCUMENT: dict[str, Any] = {
    "name": "products",
    "table": "public.products",
    "key": "id",
    "fields": ["id", "sku", "title", "price", "active"],
    "lookups": [
        {
            "name": "category",
            "table": "public.categories",
            "foreign_key": "category_id",
            "references": "id",
            "fields": ["name", "parent_id"],
        }
    ],
    "nested": [
        {
            "name": "stock",
            "table": "public.stock_levels",
            "foreign_key": "product_id",
            "fields": ["warehouse", "quantity"],
            "aggregates": {"total_stock": "sum(quantity)", "warehouses": "count(*)"},
        }
    ],
}

# The same join, by PostgreSQL: one JSON document per product, as the job writes it (the
# list sorted by the stock table's key after the product's, its warehouse; numeric as text).
JOIN_SQL = """
SELECT p.id, jsonb_build_object(
    'id', p.id, 'sku', p.sku, 'title', p.title, 'price', p.price::text, 'active', p.active,
    'category', (SELECT jsonb_build_object('name', c.name, 'parent_id', c.parent_id)
                 FROM categories c WHERE c.id = p.category_id),
    'stock', coalesce((SELECT jsonb_agg(jsonb_build_object('warehouse', s.warehouse,
                                                           'quantity', s.quantity)
                                        ORDER BY s.warehouse COLLATE "C")
                       FROM stock_levels s WHERE s.product_id = p.id), '[]'::jsonb),
    'total_stock', (SELECT coalesce(sum(s.quantity), 0) FROM stock_levels s
                    WHERE s.product_id = p.id),
    'warehouses', (SELECT count(*) FROM stock_levels s WHERE s.product_id = p.id))
FROM products p
"""
