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
