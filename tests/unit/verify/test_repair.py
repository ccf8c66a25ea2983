"""``cdc verify --repair``'s pure parts: which keys go back through the log, and the filter
that names them (quoted literals only, whatever the keys hold)."""

from __future__ import annotations

from dataclasses import dataclass, field

from cdc.incremental.filters import check_expression
from cdc.verify_repair import Repair, key_filter, keys_to_repair, repairs_text


@dataclass
class Found:
    table: str
    missing: list[str] = field(default_factory=list)
    differ: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)


def test_missing_and_differing_keys_of_every_follower_are_repaired_extra_keys_are_not() -> None:
    results = [
        Found("public.items", missing=["1"], differ=["2", "3"], extra=["9001"]),
        Found("public.items", missing=["4"], differ=["3", "5"], extra=["9002"]),
        Found("public.pairs"),
    ]
    assert keys_to_repair(results) == {"public.items": {"1", "2", "3", "4", "5"}}


def test_the_filter_names_rows_by_quoted_literals_the_filter_checks_accept() -> None:
    hostile = "x') OR true OR ('"
    where = key_filter(["a", "b"], [("2", hostile), ("1", "k1")]).as_string(None)
    assert where == """("a", "b") IN (('1', 'k1'), ('2', 'x'') OR true OR ('''))"""
    # One boolean expression over the table's columns: what cdc snapshot's check accepts.
    assert check_expression(where, ["a", "b", "v"]).sql.startswith("(a, b) IN (")
    assert key_filter(["id"], [(None,)]).as_string(None) == '("id") IN ((NULL))'


def test_the_report_says_what_was_sent_and_what_was_left() -> None:
    text = repairs_text(
        [
            Repair("public.items", 3, False, "s-1", "0/1A2B"),
            Repair("public.big", 5000, True, "s-2", "0/1A2C", "5000 keys"),
        ],
        extra=2,
    )
    assert "snapshot signal s-1 for public.items, 3 key(s), written at LSN 0/1A2B" in text
    assert "public.big, the whole table (5000 keys)" in text
    assert "2 extra key(s) not repaired" in text
    assert repairs_text([], 0) == ""
