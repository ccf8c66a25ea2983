"""``cdc verify --repair``'s pure parts: which keys go back through the log, and the filter
that names them (quoted literals only, whatever the keys hold); ``--remove-extra``'s rules
(what it deletes from a follower, and what it leaves alone)."""

from __future__ import annotations

from dataclasses import dataclass, field

from cdc.incremental.filters import check_expression
from cdc.verify_leader import Snapshot
from cdc.verify_repair import (
    Removed,
    Repair,
    key_filter,
    keys_to_repair,
    remove_extra,
    removed_text,
    repairs_text,
)


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


@dataclass
class Extra:
    table: str
    follower: str
    extra: list[str]


@dataclass
class Leader:
    """PostgreSQL's side: the rows a fresh snapshot holds, at fence LSN ``lsn``."""

    rows: dict[str, dict[str, object]]
    lsn: int = 100
    asked: list[list[str]] = field(default_factory=list)

    def read(self, table: str, keys: list[str]) -> Snapshot:
        self.asked.append(sorted(keys))
        return Snapshot(self.lsn, {k: v for k, v in self.rows.items() if k in keys})


@dataclass
class Store:
    """A follower: key → (version, token); ``remove_if`` deletes when the token still holds."""

    held_rows: dict[str, tuple[int | None, object]]
    written_since: set[str] = field(default_factory=set)
    log: list[str] = field(default_factory=list)

    def held(self, table: str, keys: list[str]) -> dict[str, tuple[int | None, object]]:
        self.log.append("held")
        return {k: v for k, v in self.held_rows.items() if k in keys}

    def remove_if(self, table: str, key: str, token: object) -> bool:
        if key in self.written_since or self.held_rows[key][1] != token:
            return False
        del self.held_rows[key]
        return True


def test_remove_extra_deletes_only_what_is_still_extra_and_unchanged() -> None:
    store = Store(
        {
            "stray": (None, b""),  # written by hand: no version
            "old": (90, b"v90"),  # a row PostgreSQL deleted, its delete lost
            "back": (95, b"v95"),  # PostgreSQL holds it again by now
            "ahead": (120, b"v120"),  # the follower has a change newer than the snapshot
            "raced": (80, b"v80"),  # the job writes it between the read and the delete
        },
        written_since={"raced"},
    )
    leader = Leader({"back": {"id": "back"}})
    done = remove_extra(
        leader,  # type: ignore[arg-type]
        {"cache": store},
        [Extra("public.t", "cache", ["stray", "old", "back", "ahead", "raced", "gone"])],
    )
    assert done == [
        Removed("public.t", "cache", ["old", "stray"], ["ahead", "back", "gone", "raced"])
    ]
    assert set(store.held_rows) == {"back", "ahead", "raced"}
    # PostgreSQL is read after the follower, only for the keys the follower still holds.
    assert leader.asked == [["ahead", "back", "old", "raced", "stray"]]


def test_keys_gone_from_the_follower_are_kept_without_reading_postgresql() -> None:
    leader = Leader({})
    done = remove_extra(
        leader,  # type: ignore[arg-type]
        {"cache": Store({})},
        [Extra("public.t", "cache", ["b", "a"])],
    )
    assert done == [Removed("public.t", "cache", [], ["a", "b"])] and leader.asked == []


def test_remove_extra_skips_followers_not_verified_and_results_without_extra() -> None:
    store = Store({"x": (None, b"")})
    done = remove_extra(
        Leader({}),  # type: ignore[arg-type]
        {"cache": store},
        [Extra("public.t", "search", ["x"]), Extra("public.t", "cache", [])],
    )
    assert done == [] and "x" in store.held_rows


def test_the_removal_report_names_what_was_left_alone() -> None:
    text = removed_text([Removed("public.t", "search", ["1", "2"], ["3"])])
    assert text == (
        "remove-extra: public.t in the search follower: 2 removed, 1 left alone (PostgreSQL "
        "holds them now, or they were written since), e.g. 3\n"
    )
