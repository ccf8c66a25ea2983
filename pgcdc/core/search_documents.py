"""Every document of an OpenSearch index, for the tools that compare a follower with the
database (the demo, ``cdc verify``'s helpers, the tests).

Pages by a scroll in index order (``_doc``): sorting by ``_id`` makes OpenSearch load field
data for it, which it deprecates with an ``OpenSearchWarning`` on the user's screen. The
answers are read by ``loads`` (exact decimals where the caller needs them; the client's
parser makes doubles).
"""

from __future__ import annotations

import contextlib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import orjson

_KEEP = "2m"  # how long the scroll lives between two pages


def _call(method: str, url: str, body: dict[str, Any] | None, timeout: float) -> bytes:
    data = orjson.dumps(body) if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out: bytes = resp.read()
        return out


def every_document(
    search_url: str,
    index: str,
    *,
    loads: Callable[[bytes], Any] = orjson.loads,
    page: int = 2000,
    timeout: float = 120.0,
    query: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """Every hit (``_id``, ``_source``) of ``index`` after a refresh; none if it is absent.
    ``query`` narrows the hits; ``extra`` adds to the search body (e.g. ``_source``,
    ``docvalue_fields``)."""
    base = search_url.rstrip("/")
    at = f"{base}/{urllib.parse.quote(index)}"
    try:
        _call("POST", f"{at}/_refresh", None, timeout)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return
        raise
    body: dict[str, Any] = {"size": page, "sort": ["_doc"], **(extra or {})}
    if query is not None:
        body["query"] = query
    answer = loads(_call("POST", f"{at}/_search?scroll={_KEEP}", body, timeout))
    scroll_id = answer.get("_scroll_id")
    try:
        while hits := answer["hits"]["hits"]:
            yield from hits
            answer = loads(
                _call(
                    "POST",
                    f"{base}/_search/scroll",
                    {"scroll": _KEEP, "scroll_id": scroll_id},
                    timeout,
                )
            )
            scroll_id = answer.get("_scroll_id", scroll_id)
    finally:
        if scroll_id:
            # If this fails the scroll expires by itself after _KEEP.
            with contextlib.suppress(urllib.error.URLError, OSError):
                _call("DELETE", f"{base}/_search/scroll", {"scroll_id": scroll_id}, timeout)


def every_hit(
    client: Any,
    index: str,
    *,
    page: int = 2000,
    query: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """:func:`every_document` through an ``opensearchpy.OpenSearch`` client, so with its TLS
    and credentials (``cdc verify`` reads with the search follower's own client)."""
    try:
        client.indices.refresh(index=index)
    except Exception as e:  # a missing index has no documents
        if getattr(e, "status_code", None) == 404:
            return
        raise
    body: dict[str, Any] = {"size": page, "sort": ["_doc"], **(extra or {})}
    if query is not None:
        body["query"] = query
    answer = client.search(index=index, body=body, params={"scroll": _KEEP})
    scroll_id = answer.get("_scroll_id")
    try:
        while hits := answer["hits"]["hits"]:
            yield from hits
            answer = client.scroll(body={"scroll": _KEEP, "scroll_id": scroll_id})
            scroll_id = answer.get("_scroll_id", scroll_id)
    finally:
        if scroll_id:
            # If this fails the scroll expires by itself after _KEEP.
            with contextlib.suppress(Exception):
                client.clear_scroll(body={"scroll_id": scroll_id})
