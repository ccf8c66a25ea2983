"""The writer of joined documents (``[[search.documents]]``): whole documents into one
index per declared document, each with its counter as an ``external_gte`` version.

A joined document's version is not an LSN (:mod:`spark_jobs.join` says why): it is the
counter the join raises each time a change touches the document. The bulk action lines,
the answers' meaning and the retries are the table follower's
(:mod:`sinks.search_requests`); what differs from :class:`sinks.search.SearchSink` is left
out: no unchanged-TOAST merge (the join holds every value), no index versions or aliases
(the document's shape is the declaration's; a rebuild goes into a fresh index).

A deleted document (its root row gone) is a versioned delete, which leaves a tombstone
OpenSearch remembers for ``index.gc_deletes``, so a replay of an older version does not
bring it back within that time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import orjson
from opensearchpy import OpenSearch
from opensearchpy.exceptions import TransportError

from pgcdc.core.errors import RetryableSinkError, SinkError
from pgcdc.core.follower_clients import opensearch_options
from pgcdc.core.settings import SearchSettings
from sinks.base import Outcome, chunks_by_bytes
from sinks.search_index import dynamic_mapping, index_settings
from sinks.search_requests import (
    MAX_EXTERNAL_VERSION,
    RETRY,
    Retrying,
    action_format,
    error_type,
    item_outcome,
    retryable_status,
    wait_started,
)

__all__ = ["DocumentWrite", "DocumentWriter"]

log = logging.getLogger(__name__)

_BULK_ITEMS: Final = "items.*._id,items.*.status,items.*.result,items.*.error"

# (document id as text, version, the document or None: deleted)
DocumentWrite = tuple[str, int, Mapping[str, Any] | None]


class DocumentWriter:
    """Writes joined documents with external versions; refusals other than "a newer
    version is held" stop the job (:class:`SinkError`), since a document left unwritten
    would differ from the join until its next change."""

    def __init__(
        self,
        client: OpenSearch,
        *,
        retrying: Retrying,
        bulk_max_bytes: int = 10 * 1024 * 1024,
        settings: Mapping[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.client = client
        self._retrying = retrying
        self.bulk_max_bytes = bulk_max_bytes
        self._settings = dict(settings or index_settings())
        self.timeout_s = timeout_s
        self._ready: set[str] = set()
        self.written = 0  # documents written or deleted (an older version refused: not)
        self.stale = 0  # writes refused because a newer version is held (replays)

    @classmethod
    def from_settings(
        cls, search: SearchSettings, sleep: Callable[[float], None] = time.sleep
    ) -> DocumentWriter:
        """A writer for the ``search`` section of the settings."""
        timeout_s = 30.0
        client = OpenSearch(
            hosts=[search.url.get_secret_value()],
            timeout=timeout_s,
            max_retries=0,
            **opensearch_options(search),
        )
        return cls(
            client,
            retrying=Retrying(6, 0.1, 5.0, sleep),
            bulk_max_bytes=search.bulk_max_bytes,
            settings=index_settings(
                shards=search.number_of_shards,
                replicas=search.number_of_replicas,
                refresh_interval=search.refresh_interval,
            ),
            timeout_s=timeout_s,
        )

    def ensure_index(self, index: str) -> None:
        """Create ``index`` (typed by its first values, no date detection) unless it
        exists, and wait until its shard answers."""
        if index in self._ready:
            return
        body = {"settings": self._settings, "mappings": dynamic_mapping(digest=False)}

        def create() -> None:
            if not self.client.indices.exists(index=index):
                try:
                    self.client.indices.create(index=index, body=body)
                    log.info("created index", extra={"index": index})
                except TransportError as e:
                    if error_type(e) != "resource_already_exists_exception":
                        raise
            wait_started(self.client, index, self.timeout_s, self._retrying.sleep)

        self._retrying.call(f"create index {index}", create)
        self._ready.add(index)

    def write(self, index: str, docs: Sequence[DocumentWrite]) -> None:
        """Index or delete each document of ``docs`` in ``index`` with its version."""
        if not docs:
            return
        self.ensure_index(index)
        formats = {kind: action_format(kind, index) for kind in ("index", "delete")}
        lines: list[bytes] = []
        for doc_id, version, doc in docs:
            if not 0 < version <= MAX_EXTERNAL_VERSION:
                raise SinkError(f"{index}/{doc_id}: version {version} is out of range")
            head = formats["delete" if doc is None else "index"] % (orjson.dumps(doc_id), version)
            lines.append(head if doc is None else head + orjson.dumps(doc) + b"\n")
        for chunk in chunks_by_bytes(lines, len, self.bulk_max_bytes):
            self._bulk(index, chunk)

    def _bulk(self, index: str, pending: list[bytes]) -> None:
        attempts = self._retrying.max_attempts
        for attempt in range(attempts):
            try:
                response = self.client.bulk(
                    body=b"".join(pending), params={"filter_path": _BULK_ITEMS}
                )
            except TransportError as e:
                if not retryable_status(e.status_code):
                    raise SinkError(f"OpenSearch refused the bulk request: {e}") from e
                if attempt == attempts - 1:
                    raise RetryableSinkError(f"OpenSearch bulk request failed: {e}") from e
                log.warning("bulk request failed (attempt %d): %s", attempt + 1, e)
                self._retrying.pause(attempt)
                continue
            again: list[bytes] = []
            reason: str | None = None
            for line, item in zip(pending, response["items"], strict=True):
                answer = next(iter(item.values()))
                outcome, why = item_outcome(answer)
                if outcome == RETRY:
                    again.append(line)
                    reason = why
                elif outcome == Outcome.APPLIED:
                    self.written += 1
                elif outcome == Outcome.SKIPPED:
                    self.stale += 1
                else:
                    raise SinkError(
                        f"OpenSearch refused document {answer.get('_id')} of {index}: "
                        f"{' '.join(str(why).split())}; "
                        "the index's field types are its first documents' (a column whose "
                        "type changed since): rebuild the documents into a fresh index with "
                        "a fresh checkpoint (docs/documents.md, Running the job)"
                    )
            if not again:
                return
            if attempt == attempts - 1:
                raise RetryableSinkError(
                    f"{len(again)} documents of {index} refused after {attempts} attempts: {reason}"
                )
            pending = again
            self._retrying.pause(attempt)

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()
