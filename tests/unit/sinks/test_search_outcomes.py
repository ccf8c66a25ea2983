"""Bulk response items → outcomes, on items captured from OpenSearch 2.19 (see the fixture)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sinks.search_requests import item_outcome

pytestmark = pytest.mark.unit

ITEMS: dict[str, Any] = json.loads(
    (Path(__file__).parent / "fixtures" / "opensearch_bulk_items.json").read_text()
)["items"]


def _outcome(name: str) -> tuple[str, str | None]:
    (item,) = ITEMS[name].values()
    return item_outcome(item)


def test_writes_and_deletes_are_applied() -> None:
    assert _outcome("created") == ("applied", None)
    assert _outcome("updated") == ("applied", None)
    assert _outcome("deleted") == ("applied", None)
    # A delete of a document never held still leaves its versioned tombstone.
    assert _outcome("delete_not_found") == ("applied", None)


def test_version_conflict_is_a_skip() -> None:
    assert _outcome("version_conflict") == ("skipped", "a newer version is held")


def test_mapping_error_fails_with_the_reason() -> None:
    outcome, reason = _outcome("mapper_parsing")
    assert outcome == "failed"
    assert reason is not None
    assert reason.startswith("mapper_parsing_exception: failed to parse field [qty]")
    assert "illegal_argument_exception" in reason  # the cause is kept


def test_throttling_is_retried() -> None:
    outcome, reason = _outcome("blocked_429")
    assert outcome == "retry"
    assert reason is not None and "cluster_block_exception" in reason


def test_a_document_that_lost_a_race_of_two_mapping_updates_is_sent_again() -> None:
    """Captured from two bulk requests adding one new field at once as text and as long (3
    shards): the loser's documents are refused with this item; sent again, the same document
    was accepted (the long held in the text field). A parse error stays a failure."""
    outcome, reason = _outcome("mapping_race")
    assert outcome == "retry"
    assert reason == (
        "illegal_argument_exception: mapper [f0] cannot be changed from type [text] to [long]"
    )
    assert _outcome("mapper_parsing")[0] == "failed"
    (other,) = json.loads(json.dumps(ITEMS["mapping_race"])).values()
    other["error"]["reason"] = "some other illegal argument"
    assert item_outcome(other)[0] == "failed"
