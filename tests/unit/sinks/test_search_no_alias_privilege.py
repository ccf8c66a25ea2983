"""A search follower whose OpenSearch user may not manage aliases (no
``indices:admin/aliases``): its indices are made without the write alias, one warning says
so, and it writes into each index itself, as before write aliases (a client standing in for
the server: the local OpenSearch has no security plugin to refuse it)."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest
from opensearchpy.exceptions import TransportError

from pgcdc.core import row_digest
from sinks.base import Change, Outcome
from sinks.search import SearchSink

pytestmark = pytest.mark.unit

_MISSING = {"error": "missing", "status": 404}


class NoAliases:
    """Creates indices, refuses anything that makes an alias (403), answers bulk writes."""

    def __init__(self) -> None:
        self.indices = self
        self.cluster = self
        self.made: dict[str, dict[str, Any]] = {}
        self.bulks: list[bytes] = []
        self.mappings_read: list[str] = []

    def info(self) -> dict[str, Any]:
        return {"version": {"distribution": "opensearch", "number": "2.19.6"}}

    def exists(self, index: str) -> bool:
        return index in self.made

    def create(self, index: str, body: dict[str, Any]) -> None:
        if body.get("aliases"):
            raise TransportError(403, "security_exception", "no permissions for aliases")
        self.made[index] = body

    def health(self, index: str) -> dict[str, str]:
        return {"status": "green"}

    def get_alias(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        return _MISSING

    def get_mapping(self, index: str, params: dict[str, Any]) -> dict[str, Any]:
        self.mappings_read.append(index)
        if index in self.made:
            return {index: {"mappings": self.made[index]["mappings"]}}
        return _MISSING

    def update_aliases(self, body: dict[str, Any]) -> None:
        raise TransportError(403, "security_exception", "no permissions for aliases")

    def bulk(self, body: bytes, params: dict[str, str]) -> dict[str, Any]:
        self.bulks.append(body)
        heads = [orjson.loads(x) for x in body.splitlines()[::2]]
        return {"items": [{k: {"status": 201}} for h in heads for k in h]}


def test_without_the_alias_privilege_it_writes_into_the_index_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = NoAliases()
    sink = SearchSink("http://127.0.0.1:1", "t", client=server, sleep=lambda _s: None)  # type: ignore[arg-type]
    name = sink.index_for("public.items")
    with caplog.at_level(logging.WARNING, logger="sinks.search"):
        for lsn in (100, 200):
            got = sink.apply([Change("public.items", "1", lsn, 0, {"id": 1})])
            assert [r.outcome for r in got] == [Outcome.APPLIED]
    assert list(server.made) == [name] and server.made[name]["aliases"] == {}
    (head, source) = server.bulks[0].splitlines()
    # The index it made keeps the row digest out of _source: known without reading it.
    assert orjson.loads(source) == {"id": 1, row_digest.FIELD: row_digest.stored("1", {"id": 1})}
    assert server.mappings_read == [name, f"{name}-W"]  # looked for before it was made
    assert orjson.loads(head) == {
        "index": {"_index": name, "_id": "1", "version": 100, "version_type": "external_gte"}
    }
    assert [r.getMessage() for r in caplog.records] == [
        f"index {name}: cannot make its write alias {name}-W (OpenSearch: alias {name}-W "
        "failed: TransportError(403, 'security_exception')): the "
        "follower writes into the index itself, which OpenSearch creates again with a dynamic "
        "mapping if it is deleted under the job (docs/production.md)"
    ]
