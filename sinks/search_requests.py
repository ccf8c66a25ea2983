"""OpenSearch requests and their answers: which failures are worth retrying, exponential
backoff with jitter, bulk action lines, and what each bulk item's answer means.

Pure code apart from the calls it is handed; :class:`sinks.search.SearchSink` uses it.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypeVar

import orjson
from opensearchpy.exceptions import TransportError

from pgcdc.core.errors import RetryableSinkError, SinkError
from sinks.base import Change, Outcome

log = logging.getLogger(__name__)

T = TypeVar("T")

# A bulk item refused with 429/5xx: sent again in the next attempt.
RETRY: Final = "retry"
ItemOutcome = Outcome | Literal["retry"]


def retryable_status(status: object) -> bool:
    """Whether a request answered with ``status`` is worth sending again."""
    # Connection errors carry the status "N/A": worth retrying like 429 and 5xx.
    return not isinstance(status, int) or status == 429 or status >= 500


class Retrying:
    """``max_attempts`` tries per request, waiting ``backoff_s * 2**attempt`` (at most
    ``max_backoff_s``, times a random factor in [0.5, 1]) between them."""

    def __init__(
        self,
        max_attempts: int,
        backoff_s: float,
        max_backoff_s: float,
        sleep: Callable[[float], None],
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.sleep = sleep

    def call(self, what: str, call: Callable[[], T]) -> T:
        """``call()``, retried on 429/5xx and connection errors.

        Raises :class:`SinkError` at once for any other status, and
        :class:`RetryableSinkError` once every attempt failed.
        """
        for attempt in range(self.max_attempts):
            try:
                return call()
            except TransportError as e:
                if not retryable_status(e.status_code):
                    raise SinkError(f"OpenSearch: {what} failed: {e}") from e
                if attempt == self.max_attempts - 1:
                    raise RetryableSinkError(f"OpenSearch: {what} failed: {e}") from e
                log.warning("%s failed (attempt %d): %s", what, attempt + 1, e)
                self.pause(attempt)
        raise AssertionError("unreachable")

    def pause(self, attempt: int) -> None:
        """Wait before attempt ``attempt + 1`` (0-based ``attempt`` just failed)."""
        delay = min(self.max_backoff_s, self.backoff_s * 2**attempt)
        self.sleep(delay * random.uniform(0.5, 1.0))


# OpenSearch's external versions are signed 64-bit longs.
MAX_EXTERNAL_VERSION: Final = (1 << 63) - 1


def check_versionable(change: Change) -> None:
    """SinkError (not retryable, the job stops) if ``change``'s commit LSN is beyond the
    largest external version: no later change could be ordered either, so failing fast is
    the only honest answer (8 EiB of WAL over the cluster's life)."""
    if change.commit_lsn > MAX_EXTERNAL_VERSION:
        raise SinkError(
            f"{change.table}/{change.key}: commit LSN {change.commit_lsn:#x} is beyond 2**63-1, "
            "the largest external version OpenSearch takes; this follower cannot order it"
        )


def bulk_action(kind: str, index: str, change: Change) -> bytes:
    """The bulk action line for ``change``: its commit LSN as an ``external_gte`` version
    (see :mod:`sinks.search` for why the LSN alone is enough). Byte for byte
    ``orjson.dumps({kind: {"_index": …, "_id": …, "version": …, "version_type": …}})``
    and a newline, filled into one format (a dict and its dump per change cost more)."""
    return action_format(kind, index) % (orjson.dumps(change.key), change.commit_lsn)


def action_format(kind: str, index: str, *, require_alias: bool = False) -> bytes:
    """:func:`bulk_action`'s line for one kind and index as a format of the id's JSON and
    the version (``% (orjson.dumps(change.key), change.commit_lsn)``): what is the same for
    every change of an index, encoded once. ``require_alias``: OpenSearch refuses the write
    (404 ``index_not_found_exception``) unless ``index`` is an alias, instead of creating
    an index of that name; deletes ignore it (an external-versioned delete creates its index
    all the same), so it is left out of theirs."""
    head, tail = action_parts(kind, index, require_alias=require_alias)
    return head.replace(b"%", b"%%") + b'%b,"version":%d,"version_type":"external_gte"' + tail


def action_parts(kind: str, index: str, *, require_alias: bool = False) -> tuple[bytes, bytes]:
    """:func:`action_format`'s line before the id's JSON, and after its version type."""
    dumps = orjson.dumps
    head = b'{%b:{"_index":%b,"_id":' % (dumps(kind), dumps(index))
    flag = require_alias and kind != "delete"
    return head, b',"require_alias":true}}\n' if flag else b"}}\n"


# Two writers of one index adding the same new field at once, with values of two types (the
# tasks of a batch, after a column's type changed again while the next index version is
# built): OpenSearch maps the field as the first asks, and refuses the other's documents
# with "mapper [f] cannot be changed from type [text] to [long]". Only a dynamic mapping
# update made beside another gives this: a field already mapped is parsed, or refused as a
# mapper_parsing_exception. Sent again, the document is parsed against the field as it is
# mapped now (on OpenSearch 2.19.6: accepted), so it is retried, not dead-lettered.
_MAPPING_RACE = re.compile(r"mapper \[.*\] cannot be changed from type \[.*\] to \[.*\]")


def item_outcome(item: Mapping[str, Any]) -> tuple[ItemOutcome, str | None]:
    """``(outcome, reason)`` of one bulk response item; outcome ``"retry"`` for 429/5xx and
    for a document that lost a race of two mapping updates (:data:`_MAPPING_RACE`)."""
    status = int(item.get("status", 500))
    if 200 <= status < 300:
        return (Outcome.APPLIED, None)
    if status == 404 and item.get("result") == "not_found":
        # Deleting a document we never held: the tombstone is written all the same.
        return (Outcome.APPLIED, None)
    if status == 409:
        return (Outcome.SKIPPED, "a newer version is held")
    error = item.get("error") or {}
    if isinstance(error, Mapping):
        reason = f"{error.get('type', 'error')}: {error.get('reason', '')}"
        cause = error.get("caused_by")
        if isinstance(cause, Mapping):
            reason += f" ({cause.get('type', '')}: {cause.get('reason', '')})"
    else:
        reason = str(error)
    if retryable_status(status) or _lost_mapping_race(error):
        return (RETRY, reason)
    return (Outcome.FAILED, reason)


def _lost_mapping_race(error: object) -> bool:
    return (
        isinstance(error, Mapping)
        and error.get("type") == "illegal_argument_exception"
        and _MAPPING_RACE.fullmatch(str(error.get("reason", ""))) is not None
    )


def error_type(e: TransportError) -> str | None:
    """The ``error.type`` OpenSearch answered with, if any."""
    info = e.info
    if isinstance(info, Mapping):
        error = info.get("error")
        if isinstance(error, Mapping):
            kind = error.get("type")
            return kind if isinstance(kind, str) else None
    return None


def wait_started(client: Any, index: str, timeout_s: float, sleep: Callable[[float], None]) -> None:
    """Wait until ``index``'s shard is started: a new index (maybe created by a writer that
    was killed a moment ago) answers reads only then. A retryable 503 after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while client.cluster.health(index=index).get("status") not in ("yellow", "green"):
        if time.monotonic() >= deadline:
            raise TransportError(503, "index_not_ready", f"{index} has no started shard")
        sleep(0.2)
