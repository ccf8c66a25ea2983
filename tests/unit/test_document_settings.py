"""Declared documents (``[[search.documents]]``): the documented example is the demo's
product document and becomes the join core's spec; every refusal is one line naming the
document and the wrong key, with where it was set; the spec built from the settings drives
the join to the document the settings describe."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from pgcdc.core.contract import document_index, table_index
from pgcdc.core.document_settings import parse_aggregate
from pgcdc.core.errors import ConfigError
from pgcdc.core.settings import load_settings
from spark_jobs.document_specs import document_specs
from spark_jobs.join import Aggregate, DocumentSpec, JoinChange, JoinState, Lookup, Nested
from tests.docs_blocks import ROOT, blocks

pytestmark = pytest.mark.unit

DOCS = ROOT / "docs" / "documents.md"
THIS = "tests/unit/test_document_settings.py::test_the_documented_example_is_the_demo_document"

DEMO_SPEC = DocumentSpec(
    root="public.products",
    root_key="id",
    fields=("id", "sku", "title", "price", "active"),
    lookups=(
        Lookup(
            "category",
            "public.categories",
            on="category_id",
            key="id",
            fields=("name", "parent_id"),
        ),
    ),
    nested=(
        Nested(
            "stock",
            "public.stock_levels",
            on="product_id",
            fields=("warehouse", "quantity"),
            aggregates=(
                Aggregate("total_stock", "sum", "quantity"),
                Aggregate("warehouses", "count", "*"),
            ),
        ),
    ),
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.upper().startswith("CDC_"):
            monkeypatch.delenv(k)


def _documented_example() -> str:
    found = [
        b.text
        for b in blocks(DOCS)
        if b.lang == "toml" and any(d.kind == "covered-by" and d.text == THIS for d in b.directives)
    ]
    assert len(found) == 1, f"{DOCS} has one toml block marked covered-by {THIS}"
    return found[0]


def _load(tmp_path: Path, text: str) -> Any:
    f = tmp_path / "cdc.toml"
    f.write_text(text)
    return load_settings(f, environ={})


def _refusal(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, text)
    message = str(e.value)
    assert "\n" not in message, message
    return message


def test_the_documented_example_is_the_demo_document(tmp_path: Path) -> None:
    settings = _load(tmp_path, _documented_example())
    assert document_specs(settings.search) == {"cdc-products": DEMO_SPEC}
    # The columns it names are the demo's (demo/schema.sql), so the example can run there.
    schema = (ROOT / "demo" / "schema.sql").read_text()
    for table, columns in {
        "products": (*DEMO_SPEC.fields, "category_id"),
        "categories": ("id", "name", "parent_id"),
        "stock_levels": ("product_id", "warehouse", "quantity"),
    }.items():
        body = re.search(rf"CREATE TABLE {table} \((.*?)\n\);", schema, re.S)
        assert body is not None, table
        declared = {line.split()[0] for line in body.group(1).splitlines() if line.strip()}
        assert set(columns) <= declared, (table, set(columns) - declared)


def test_no_documents_by_default() -> None:
    settings = load_settings(environ={})
    assert settings.search.documents == ()
    assert document_specs(settings.search) == {}


def test_the_environment_takes_the_same_documents_as_json(tmp_path: Path) -> None:
    raw = tomllib.loads(_documented_example())["search"]["documents"]
    from_env = load_settings(environ={"CDC_SEARCH__DOCUMENTS": json.dumps(raw)})
    assert from_env.search.documents == _load(tmp_path, _documented_example()).search.documents
    with pytest.raises(ConfigError, match=r"^CDC_SEARCH__DOCUMENTS is not valid JSON"):
        load_settings(environ={"CDC_SEARCH__DOCUMENTS": "[{"})
    with pytest.raises(ConfigError, match=r"^CDC_SEARCH__DOCUMENTS must be a JSON list"):
        load_settings(environ={"CDC_SEARCH__DOCUMENTS": json.dumps(raw[0])})
    raw[0]["lookups"][0]["references"] = ""
    with pytest.raises(ConfigError) as e:
        load_settings(environ={"CDC_SEARCH__DOCUMENTS": json.dumps(raw)})
    assert str(e.value) == (
        'invalid setting search.documents["products"].lookups["category"].references = \'\' '
        "(from CDC_SEARCH__DOCUMENTS): references must name a column"
    )


def test_the_spec_from_the_settings_drives_the_join(tmp_path: Path) -> None:
    """Round trip: the settings' spec, fed the demo's rows as changes, makes the document the
    settings describe (fields kept, the lookup embedded, the list in key order, aggregates)."""
    (spec,) = document_specs(_load(tmp_path, _documented_example()).search).values()
    state = JoinState(spec)
    product = {"id": 7, "sku": "S7", "title": "Lamp", "price": "24.90", "active": True}
    rows: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("public.products", (7,), {**product, "category_id": 3, "description": "long"}),
        ("public.categories", (3,), {"id": 3, "name": "Lighting", "parent_id": None}),
        (
            "public.stock_levels",
            (7, "south"),
            {"product_id": 7, "warehouse": "south", "quantity": 0},
        ),
        (
            "public.stock_levels",
            (7, "north"),
            {"product_id": 7, "warehouse": "north", "quantity": 3},
        ),
        (
            "public.stock_levels",
            (8, "north"),
            {"product_id": 8, "warehouse": "north", "quantity": 9},
        ),
    ]
    for lsn, (table, key, row) in enumerate(rows, start=1):
        state.apply(JoinChange(table, key, (lsn, 0), row))
    _, doc = state.document(7)
    assert doc == {
        **product,
        "category": {"name": "Lighting", "parent_id": None},
        "stock": [{"warehouse": "north", "quantity": 3}, {"warehouse": "south", "quantity": 0}],
        "total_stock": 3,
        "warehouses": 2,
    }


# --- refusals: one line, naming the document and the key, with the file's line -----------

BASE = """\
[search]
index_prefix = "shop"

[[search.documents]]
name = "products"
table = "public.products"
key = "id"
fields = ["id", "sku"]

[[search.documents.lookups]]
name = "category"
table = "public.categories"
foreign_key = "category_id"
references = "id"
fields = ["name"]

[[search.documents.nested]]
name = "stock"
table = "public.stock_levels"
foreign_key = "product_id"
fields = ["warehouse", "quantity"]
aggregates = { total_stock = "sum(quantity)" }
"""
OTHER = """
[[search.documents]]
name = "orders"
table = "public.orders"
key = "id"
fields = ["id"]
"""
DOC = 'search.documents["products"]'
LOOKUP = f'{DOC}.lookups["category"]'
NESTED = f'{DOC}.nested["stock"]'


def test_the_base_of_the_refusals_is_accepted(tmp_path: Path) -> None:
    assert list(document_specs(_load(tmp_path, BASE + OTHER).search)) == [
        "shop-products",
        "shop-orders",
    ]


@pytest.mark.parametrize(
    ("old", "new", "where", "line", "says"),
    [
        # join columns must be named
        (
            'foreign_key = "category_id"\n',
            "",
            f"missing setting {LOOKUP}.foreign_key",
            10,
            "the root table's column",
        ),
        ('references = "id"\n', "", f"missing setting {LOOKUP}.references", 10, "key column"),
        (
            'foreign_key = "product_id"\n',
            "",
            f"missing setting {NESTED}.foreign_key",
            17,
            "holding the root's key",
        ),
        ('key = "id"\n', "", f"missing setting {DOC}.key", 4, "the document's id"),
        (
            'references = "id"',
            'references = "  "',
            f"{LOOKUP}.references",
            14,
            "references must name a column",
        ),
        # unknown keys name the closest
        (
            "aggregates = {",
            "aggregate = {",
            f"{NESTED}.aggregate",
            22,
            "is not a setting: did you mean aggregates? (keys: name, table, foreign_key, ",
        ),
        # tables are schema.table
        (
            'table = "public.categories"',
            'table = "categories"',
            f"{LOOKUP}.table",
            12,
            "must be written as schema.table",
        ),
        # names: the index, and the document's fields
        (
            'name = "products"',
            'name = "public.products"',
            'search.documents["public.products"].name',
            5,
            "a dot, as the index of a table does",
        ),
        (
            'name = "products"',
            'name = "Products"',
            'search.documents["Products"].name',
            5,
            "lower-case letters, digits and _",
        ),
        (
            'name = "category"',
            'name = "sku"',
            DOC,
            4,
            "lookups.sku: the document's field 'sku' also comes from the root's field 'sku'",
        ),
        (
            'total_stock = "sum',
            'stock = "sum',
            DOC,
            4,
            "field 'stock' also comes from nested.stock",
        ),
        (
            'fields = ["warehouse", "quantity"]',
            'fields = ["quantity", "quantity"]',
            f"{NESTED}.fields",
            21,
            "'quantity' is listed twice",
        ),
        ('fields = ["name"]', 'fields = ["*"]', f"{LOOKUP}.fields", 15, "list the columns"),
        ('fields = ["name"]', "fields = []", f"{LOOKUP}.fields", 15, "at least one column"),
        (
            'name = "category"',
            'name = "_id"',
            f'{DOC}.lookups["_id"].name',
            11,
            "not starting with '_' (OpenSearch's own fields)",
        ),
        (
            "total_stock =",
            '"stock.total" =',
            f"{NESTED}.aggregates",
            22,
            "name 'stock.total' must be a field name of the document: not empty, no '.'",
        ),
        # aggregates
        (
            "sum(quantity)",
            "sum(qty)",
            f"{NESTED}.aggregates",
            22,
            "'qty' is not one of the list's fields (warehouse, quantity)",
        ),
        (
            "sum(quantity)",
            "avg(quantity)",
            f"{NESTED}.aggregates",
            22,
            "avg is not supported; the aggregates are count(*), sum(column), min(column) and max(column)",
        ),
        (
            "sum(quantity)",
            "count(quantity)",
            f"{NESTED}.aggregates",
            22,
            "count(*) counts the list's rows",
        ),
        ("sum(quantity)", "sum quantity", f"{NESTED}.aggregates", 22, "is not function(column)"),
        # shapes the join core does not take
        (
            'fields = ["name"]\n',
            'fields = ["name"]\n[[search.documents.lookups.lookups]]\nname = "parent"\n',
            DOC,
            4,
            "lookups.category.lookups: lookups of a lookup are not "
            "supported; supported: lookups (many-to-one) and nested lists (one-to-many)",
        ),
        (
            "aggregates = {",
            '[[search.documents.nested.nested]]\nname = "x"\naggregates = {',
            DOC,
            4,
            "nested.stock.nested: lists inside a list are not supported; supported:",
        ),
        (
            "aggregates = {",
            '[[search.documents.nested.lookups]]\nname = "x"\naggregates = {',
            DOC,
            4,
            "lookups of a nested list's rows are not supported; supported:",
        ),
        (
            'fields = ["name"]',
            'fields = ["name"]\naggregates = { n = "count(*)" }',
            DOC,
            4,
            "lookups.category.aggregates: a lookup embeds one row and has no aggregates",
        ),
        (
            'key = "id"',
            'key = "id"\naggregates = { n = "count(*)" }',
            DOC,
            4,
            "aggregates: a document's aggregates belong to one of its nested lists",
        ),
        (
            'foreign_key = "category_id"',
            'foreign_key = ["category_id", "tenant"]',
            DOC,
            4,
            "lookups.category.foreign_key = ['category_id', 'tenant']: a join on more than one "
            "column is not supported",
        ),
        (
            'key = "id"',
            'key = ["tenant", "id"]',
            DOC,
            4,
            "key = ['tenant', 'id']: a document's id on more than one column is not supported",
        ),
        (
            'table = "public.stock_levels"',
            'table = "public.categories"',
            DOC,
            4,
            "nested.stock: public.categories is joined twice (also by lookups.category)",
        ),
        (
            'table = "public.categories"',
            'table = "public.products"',
            DOC,
            4,
            "lookups.category: joins the root table public.products to itself",
        ),
    ],
)
def test_a_wrong_document_is_refused_naming_it_and_the_key(
    tmp_path: Path, old: str, new: str, where: str, line: int, says: str
) -> None:
    assert old in BASE
    message = _refusal(tmp_path, BASE.replace(old, new, 1))
    assert where in message and f"cdc.toml line {line})" in message, message
    assert says in message, message


def test_two_documents_of_one_name_are_refused(tmp_path: Path) -> None:
    message = _refusal(tmp_path, BASE + OTHER.replace('"orders"', '"products"'))
    assert message.startswith("invalid setting search.documents (from "), message
    assert "documents 1 and 2 are both named 'products'" in message


def test_an_index_too_long_for_opensearch_is_refused(tmp_path: Path) -> None:
    long_name = "p" * 251  # shop-ppp...: 256 bytes
    message = _refusal(tmp_path, BASE.replace('name = "products"', f'name = "{long_name}"'))
    assert "longer than OpenSearch's 255 bytes" in message


def test_every_wrong_key_is_reported_at_once(tmp_path: Path) -> None:
    text = BASE.replace('references = "id"\n', "").replace("sum(quantity)", "max(qty)")
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, text)
    assert str(e.value).startswith("2 problems with the settings:")
    assert f"{LOOKUP}.references" in str(e.value) and f"{NESTED}.aggregates" in str(e.value)


def test_tables_not_captured_are_allowed(tmp_path: Path) -> None:
    text = 'postgres.tables = ["public.products"]\n' + BASE.replace(
        '"public.categories"', """'"Other Schema"."Not Captured"'"""
    )
    specs = document_specs(_load(tmp_path, text).search)
    assert specs["shop-products"].lookups[0].table == "Other-20Schema.Not-20Captured"


# --- the parts the refusals rely on --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("sum(quantity)", ("sum", "quantity")),
        (" MAX ( quantity ) ", ("max", "quantity")),
        ("count(*)", ("count", "*")),
        ("min(a (b))", ("min", "a (b)")),
    ],
)
def test_aggregates_parse(text: str, parsed: tuple[str, str]) -> None:
    assert parse_aggregate(text) == parsed


@pytest.mark.parametrize("text", ["sum(*)", "sum()", "count(x)", "median(x)", "sum x", ""])
def test_aggregates_that_are_not_supported(text: str) -> None:
    with pytest.raises(ValueError, match="count"):
        parse_aggregate(text)


def test_a_document_index_never_meets_a_table_index() -> None:
    names = ["products", "p", "public", "cdc_watermarks", "products_v2", "a1_b2"]
    tables = [
        ("public", "products"),
        ("products", "v2"),
        ("cdc", "watermarks"),
        ("public", "products_v2"),
    ]
    for prefix in ("cdc", "Shop"):
        documents = {document_index(prefix, n) for n in names}
        assert len(documents) == len(names)
        indices = {table_index(prefix, f"{s}.{t}") for s, t in tables}
        assert not documents & indices
        assert all("." in i for i in indices) and not any("." in d for d in documents)
    assert document_index("Shop", "products") == "shop-products"
