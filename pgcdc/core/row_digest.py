"""A row's digest, the one ``cdc verify`` folds inside each store (issue 32).

A row is the document the followers are given (column → JSON value). Its digest is the SHA-1
of the document id, a NUL, and the document as JSON with its top-level fields in sorted
order (:func:`canonical`): the bytes ``orjson.dumps`` gives a dict, so Redis's hash fields
(each column's value as ``orjson.dumps`` text) concatenate into the same text, inside a
Redis script, given the column names in that order. Three 20-bit parts of it are summed, so
a fold is exact in a Lua number or an OpenSearch ``sum`` (a double) up to 2**33 rows.

Which bucket a row falls in depends on its id alone (:func:`key_hash`): 32 bits of the SHA-1
of the id. Both sides of a comparison fold rows into ``2**BUCKET_BITS`` buckets by its top
bits; a bucket whose folds differ is compared row by row.

The search follower keeps each document's key hash and parts beside it, in :data:`FIELD`, an
object that the index's mapping leaves out of ``_source``: a document written by anyone
else (a partial ``_update``, a reindex, a restore of another writer's document) loses it,
and is read back and compared as it is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any, Final

import orjson

from pgcdc.core import native


def _sha1(data: bytes) -> Any:
    return hashlib.sha1(data, usedforsecurity=False)


# Longer than any PostgreSQL identifier (63 bytes), so no column can have this name.
FIELD: Final = "_pgcdc_row_digest_kept_beside_the_row_and_left_out_of_source_by_cdc_verify"
BUCKET_BITS: Final = 15  # 32,768 buckets: under OpenSearch's default search.max_buckets
_PART: Final = (1 << 20) - 1  # each of the three parts: 5 hex digits


def canonical(doc: Mapping[str, Any]) -> bytes:
    """The document as JSON, its top-level fields sorted (values as ``orjson.dumps`` gives
    them, nested objects in their own order)."""
    text = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
    if text.find(b"{", 1) == -1:  # no nested object (or a brace in a string): the same
        return text
    return orjson.dumps(dict(sorted(doc.items())))


def _digest64(key: bytes, doc: Mapping[str, Any]) -> int:
    """The first 64 bits of the row's SHA-1 (16 hex digits, as Lua's ``redis.sha1hex``)."""
    return int.from_bytes(_sha1(key + b"\0" + canonical(doc)).digest()[:8], "big")


def digest_hex(key: str, doc: Mapping[str, Any]) -> str:
    """The row's digest: SHA-1 of the id, NUL, :func:`canonical`, in hex (its first 16
    digits)."""
    return f"{_digest64(key.encode(), doc):016x}"


def digest(key: str, doc: Mapping[str, Any]) -> int:
    """The row's 60-bit digest (the first 15 hex digits): what a row-by-row comparison
    compares, and what the three parts (:func:`parts_of`) are cut from."""
    return _digest64(key.encode(), doc) >> 4


def digest_of_canonical(key: str, text: bytes) -> int:
    """:func:`digest` of a row given as its :func:`canonical` bytes (a Redis hash's fields
    put together, a document's ``_source``)."""
    raw = key.encode(errors="surrogateescape")  # an id read from Redis that is no UTF-8
    return int.from_bytes(_sha1(raw + b"\0" + text).digest()[:8], "big") >> 4


def split60(d: int) -> tuple[int, int, int]:
    """A 60-bit :func:`digest` cut into the three parts folds sum."""
    return d >> 40, (d >> 20) & _PART, d & _PART


def parts_of(x: int) -> tuple[int, int, int]:
    """The three 20-bit parts that folds sum: hex digits 1–5, 6–10 and 11–15 of a digest's
    first 64 bits ``x``."""
    return x >> 44, (x >> 24) & _PART, (x >> 4) & _PART


def parts(key: str, doc: Mapping[str, Any]) -> tuple[int, int, int]:
    """The row's digest parts."""
    return parts_of(_digest64(key.encode(), doc))


def key_hash(key: str) -> int:
    """32 bits of the SHA-1 of the document id (its first 8 hex digits): where the row
    falls."""
    return int.from_bytes(_sha1(key.encode()).digest()[:4], "big")


def bucket(hashed_key: int) -> int:
    """The bucket of a :func:`key_hash`."""
    return hashed_key >> (32 - BUCKET_BITS)


def stored(key: str, doc: Mapping[str, Any]) -> dict[str, int]:
    """What the search follower keeps in :data:`FIELD` for a document: its key hash ``b``
    and digest parts ``h1``–``h3``."""
    k = key.encode()
    x = _digest64(k, doc)
    return {
        "b": int.from_bytes(_sha1(k).digest()[:4], "big"),
        "h1": x >> 44,
        "h2": (x >> 24) & _PART,
        "h3": (x >> 4) & _PART,
    }


def stored_function() -> Callable[[str, Mapping[str, Any]], dict[str, int]]:
    """:func:`stored`, or its twin that hashes in the native module when that is installed
    (the same numbers: ``tests/unit/verify/test_native.py``)."""
    mod = native.module()
    if mod is None:
        return stored
    parts = mod.stored

    def stored_natively(key: str, doc: Mapping[str, Any]) -> dict[str, int]:
        b, h1, h2, h3 = parts(key.encode(), canonical(doc))
        return {"b": b, "h1": h1, "h2": h2, "h3": h3}

    return stored_natively


def folded(key: str, doc: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """The row's bucket and its digest's three parts, in one call (a fold's inner loop)."""
    k = key.encode()
    x = int.from_bytes(_sha1(k + b"\0" + canonical(doc)).digest()[:8], "big")
    b = int.from_bytes(_sha1(k).digest()[:4], "big") >> (32 - BUCKET_BITS)
    return b, x >> 44, (x >> 24) & _PART, (x >> 4) & _PART


def folded_text(key: bytes, text: bytes) -> tuple[int, int, int, int]:
    """:func:`folded` of a row given as its id's bytes and its :func:`canonical` bytes."""
    x = int.from_bytes(_sha1(key + b"\0" + text).digest()[:8], "big")
    b = int.from_bytes(_sha1(key).digest()[:4], "big") >> (32 - BUCKET_BITS)
    return b, x >> 44, (x >> 24) & _PART, (x >> 4) & _PART


# bucket → [rows, sum of part 1, part 2, part 3]
Folds = dict[int, list[int]]


def fold_into(folds: Folds, b: int, h1: int, h2: int, h3: int) -> None:
    """Add one row (its bucket and digest parts) to ``folds``."""
    f = folds.get(b)
    if f is None:
        folds[b] = [1, h1, h2, h3]
    else:
        f[0] += 1
        f[1] += h1
        f[2] += h2
        f[3] += h3


def add_folds(into: Folds, part: Folds) -> None:
    """Add ``part``'s folds (other rows of the same table) to ``into``."""
    for b, (n, h1, h2, h3) in part.items():
        f = into.get(b)
        if f is None:
            into[b] = [n, h1, h2, h3]
        else:
            f[0] += n
            f[1] += h1
            f[2] += h2
            f[3] += h3


def fold_docs(rows: Mapping[str, Mapping[str, Any]]) -> Folds:
    """The folds of documents held in memory (id → document)."""
    folds: Folds = {}
    for key, doc in rows.items():
        fold_into(folds, *folded(key, doc))
    return folds


def mapping_properties() -> dict[str, Any]:
    """The mapping of :data:`FIELD`: doc values to aggregate, nothing indexed but the key
    hash (ranged over)."""
    part = {"type": "long", "index": False}
    return {
        FIELD: {
            "properties": {"b": {"type": "long"}, "h1": part, "h2": part, "h3": part},
        }
    }
