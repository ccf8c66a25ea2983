"""The joined documents' writer (sinks/search_documents.py) against the real OpenSearch: its
versions, and the one line a document the index cannot take stops the job with."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pgcdc.core.errors import SinkError
from pgcdc.core.search_documents import every_document
from pgcdc.core.settings import SearchSettings
from sinks.search_documents import DocumentWriter
from tests.conftest import Endpoints

pytestmark = pytest.mark.integration


@pytest.fixture
def writer(endpoints: Endpoints) -> Iterator[DocumentWriter]:
    w = DocumentWriter.from_settings(
        SearchSettings(url=endpoints.search_url),  # type: ignore[arg-type]
        sleep=lambda _s: None,
    )
    yield w
    w.close()


def test_versions_and_a_document_the_index_cannot_take(
    writer: DocumentWriter, endpoints: Endpoints, index_prefix: str
) -> None:
    index = f"{index_prefix}-products"
    writer.write(index, [("1", 2, {"id": 1, "total_stock": 5}), ("2", 1, {"id": 2})])
    # An older version sent again (a replay) is refused as stale; an equal one is taken.
    writer.write(index, [("1", 1, {"id": 1, "total_stock": 0}), ("2", 1, {"id": 2})])
    assert writer.stale == 1
    writer.write(index, [("2", 3, None)])  # the root row gone: a versioned delete
    docs = {h["_id"]: h["_source"] for h in every_document(endpoints.search_url, index)}
    assert docs == {"1": {"id": 1, "total_stock": 5}}
    # total_stock was typed a number by its first document: an object is refused for good,
    # and the job stops with one line naming the document and the way past it.
    with pytest.raises(SinkError) as refused:
        writer.write(index, [("1", 4, {"id": 1, "total_stock": {"north": 5}})])
    line = str(refused.value)
    assert "\n" not in line
    assert f"document 1 of {index}" in line and "rebuild the documents" in line, line
