"""The versions of a table's OpenSearch index: the one searches read, the one being built
beside it after a schema change, and the atomic switch between them (issue 38).

A table's index name ``N`` (:func:`sinks.search_index.index_name`) is what searches and the
follower use. The first index of a table is a concrete index named ``N`` (version 1, as
every index before versions were made). When the table's columns change in a way ``N``'s
mapping cannot hold (a type change), the follower builds version ``K+1`` under its own name
(:func:`version_name`, ``N-v<K+1>``: ``-v`` never occurs in an encoded table name), with the
new mapping, and writes every change to both; searches keep reading ``N``, complete, the
whole time. Version ``K+1`` has caught up when it holds every document the serving version
holds (:func:`missing`): the reader snapshots the table again after the change, so each row
that did not change since reaches the new version too. Then :func:`switch` makes ``N`` an
alias of version ``K+1`` in one atomic ``_aliases`` call (removing a concrete ``N`` in the
same call) and the old version is retired after.

What version an index is lives in its mapping's ``_meta`` (``pgcdc_version``), so a name cut
to fit 255 bytes (hashed) still says it. A build that was under way when the job died is
found again by its name: the next version's index exists.

Every function takes the client and raises the client's errors; the sink retries them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from opensearchpy import OpenSearch
from opensearchpy.exceptions import NotFoundError

from pgcdc.core.contract import MAX_INDEX_NAME_BYTES, fit_name

META_KEY: Final = "pgcdc_version"
NAME_KEY: Final = "pgcdc_index"  # the table index name a version belongs to
# A commit LSN of a change in the shape a next version was made for: every change of an older
# shape committed before it (an ALTER TABLE orders the commits around it).
SHAPE_LSN_KEY: Final = "pgcdc_shape_lsn"
PAGE: Final = 10_000  # ids per page when comparing two versions


def version_of(name: str, index: str) -> int | None:
    """The version ``index`` is of the table index ``name`` by its name (None: no version's
    name of it; a version's name cut to fit is not told)."""
    head, sep, version = index.rpartition("-v")
    if sep and head == name and version.isdigit() and int(version) >= 2:
        return int(version)
    return None


def version_name(name: str, version: int) -> str:
    """The concrete index of ``version`` (2 or more) of the table index ``name``."""
    if version < 2:
        raise ValueError(f"version {version}: version 1 is the index {name} itself")
    return fit_name(f"{name}-v{version}", MAX_INDEX_NAME_BYTES)


def write_alias(name: str) -> str:
    """The alias the follower writes ``name``'s serving version through (and, for a next
    version's index, that version through). Upper case on purpose: OpenSearch never creates
    an index of that name (index names are lower case), so a write or an externally
    versioned delete into it once its index is gone is refused (``index_not_found``), never
    the start of a new index with a dynamic mapping (``require_alias`` alone does not cover
    deletes: OpenSearch 2.19 creates the index of an external-versioned delete)."""
    return fit_name(name, MAX_INDEX_NAME_BYTES - 2) + "-W"


def with_version(
    mapping: Mapping[str, Any], name: str, version: int, shape_lsn: int | None = None
) -> dict[str, Any]:
    """``mapping`` recording that its index is ``version`` of the table index ``name``, made
    for the shape of a change committed at ``shape_lsn`` (if known)."""
    meta = {**dict(mapping.get("_meta") or {}), META_KEY: version, NAME_KEY: name}
    if shape_lsn is not None:
        meta[SHAPE_LSN_KEY] = shape_lsn
    return {**mapping, "_meta": meta}


def shape_lsn(client: OpenSearch, index: str) -> int | None:
    """The commit LSN ``index`` records for the shape it was made for (:func:`with_version`),
    or None: no such index, or one made without it."""
    got = mappings(client, index)
    body = (got or {}).get(index) or {}
    lsn = (body.get("mappings", {}).get("_meta") or {}).get(SHAPE_LSN_KEY)
    return int(lsn) if lsn is not None else None


@dataclass(frozen=True)
class Serving:
    """The concrete index searches read through ``name``, and its version."""

    name: str  # the table's index name: an alias, or (version 1) the index itself
    index: str  # the concrete index
    version: int

    @property
    def is_alias(self) -> bool:
        return self.index != self.name

    @property
    def next_index(self) -> str:
        return version_name(self.name, self.version + 1)


def mappings(client: OpenSearch, name: str) -> dict[str, Any] | None:
    """The mappings of the indices ``name`` names, or None if there is no such index or
    alias (asked so that the client logs no failed request: a name found missing is an
    answer here)."""
    got = client.indices.get_mapping(index=name, params={"ignore": 404})
    if got.get("status") == 404 and "error" in got:
        return None
    return dict(got)


def serving(client: OpenSearch, name: str) -> Serving | None:
    """What ``name`` reads now, or None if there is no such index or alias."""
    got = mappings(client, name)
    if got is None:
        return None
    if len(got) != 1:
        raise ValueError(f"{name} names {len(got)} indices, not one: {sorted(got)}")
    ((index, body),) = got.items()
    meta = body.get("mappings", {}).get("_meta") or {}
    return Serving(name, index, int(meta.get(META_KEY, 1)))


def building(client: OpenSearch, now: Serving) -> str | None:
    """The next version's index if a build of it is under way: its index exists and says it
    is that version of ``now.name`` (an index of that name made by someone else is no build:
    :func:`foreign`; a table's own index never has that name, since its ``-`` is escaped)."""
    nxt = now.next_index
    got = mappings(client, nxt)
    if got is None:
        return None
    body = got.get(nxt) or {}
    meta = body.get("mappings", {}).get("_meta") or {}
    ours = meta.get(NAME_KEY) == now.name and int(meta.get(META_KEY, 0)) == now.version + 1
    return nxt if ours else None


def foreign(client: OpenSearch, now: Serving) -> bool:
    """Whether the next version's name is taken by an index that is not that version."""
    return building(client, now) is None and bool(client.indices.exists(index=now.next_index))


def under_way(client: OpenSearch, prefix: str) -> list[tuple[Serving, str]]:
    """Every build under way among the indices of ``prefix``: (what the name reads now, the
    next version), found by the versions' own indices, so whoever runs this (the job's
    driver) sees the builds the workers started."""
    try:
        got = client.indices.get_mapping(index=f"{prefix}-*-v*")
    except NotFoundError:
        return []
    found = []
    for index, body in got.items():
        meta = body.get("mappings", {}).get("_meta") or {}
        name, version = meta.get(NAME_KEY), int(meta.get(META_KEY, 0))
        # Only an index whose name is the version it says it is: an index someone else made
        # under the prefix never becomes what a table's name reads.
        if not name or version < 2 or index != version_name(str(name), version):
            continue
        now = serving(client, str(name))
        if now is not None and now.index != index and now.version == version - 1:
            found.append((now, index))
    return found


def unnamed(client: OpenSearch, prefix: str) -> list[tuple[str, str]]:
    """(name, index) for every version index of ``prefix`` that the follower writes through
    its name's write alias but that the name no longer reads: the name's alias was deleted,
    the index kept (one request: the versions' aliases; a name cut to fit is not told)."""
    try:
        got = client.indices.get_alias(index=f"{prefix}-*-v*")
    except NotFoundError:
        return []
    found = []
    for index, body in got.items():
        aliases = set((body or {}).get("aliases") or {})
        for alias in aliases:
            name = alias[:-2] if alias.endswith("-W") else None
            if not name or name == index or name in aliases or write_alias(name) != alias:
                continue
            if (version_of(name, index) or 0) >= 2:
                found.append((name, index))
    return found


def _ids(client: OpenSearch, index: str, page: int) -> Iterator[list[str]]:
    """Every document id of ``index``, a page at a time: each shard's documents in the order
    of their sequence numbers (unique in a shard), by ``search_after``.

    Not by a sort on ``_id``: OpenSearch then loads every id of the index into its heap as
    field data, and deprecates it with a warning that reached the job's output. Nor by a
    scroll: its pages need a cluster privilege (``indices:data/read/scroll``) that the
    follower's user need not have. A document written meanwhile gets a higher sequence
    number, so it may be met twice, never missed; and a write during a build reaches the
    version being built too."""
    shards = int(client.search(index=index, body={"size": 0})["_shards"]["total"])
    for shard in range(shards):
        after: list[Any] | None = None
        while True:
            body: dict[str, Any] = {
                "size": page,
                "_source": False,
                "sort": [{"_seq_no": "asc"}],
                "query": {"match_all": {}},
            }
            if after is not None:
                body["search_after"] = after
            answer = client.search(
                index=index, body=body, params={"preference": f"_shards:{shard}"}
            )
            hits = answer["hits"]["hits"]
            if not hits:
                break
            yield [h["_id"] for h in hits]
            after = hits[-1]["sort"]


def count(client: OpenSearch, index: str) -> int:
    return int(client.count(index=index)["count"])


def missing(client: OpenSearch, now: Serving, target: str, page: int = PAGE) -> int:
    """How many documents of the serving version ``target`` lacks (0: caught up). Both are
    refreshed first, so what was written is compared. A count first: while the target holds
    fewer documents it cannot have them all, and that check reads no id."""
    client.indices.refresh(index=f"{now.index},{target}")
    short = count(client, now.index) - count(client, target)
    if short > 0:
        return short
    lacking = 0
    for ids in _ids(client, now.index, page):
        found = client.count(index=target, body={"query": {"ids": {"values": ids}}})["count"]
        lacking += len(ids) - int(found)
    return lacking


def switch(client: OpenSearch, now: Serving, target: str) -> str | None:
    """Make ``now.name`` read ``target`` in one atomic call; the old version to
    :func:`retire` once the searches that had already resolved to it are done (None: there
    is none left).

    A concrete version 1 is removed in that same call (``remove_index``): that is what lets
    its name become the alias with no moment in which the name answers nothing, but a search
    in flight on its shards at that instant fails (503, all shards failed) and is retried by
    the searcher. From an alias (version 2 on) the switch moves the alias only, and the old
    version stays until it is retired: no search fails."""
    write = write_alias(now.name)
    if now.is_alias:
        old: list[dict[str, Any]] = [
            {"remove": {"index": now.index, "alias": now.name}},
            # An index made before write aliases has none: not an error.
            {"remove": {"index": now.index, "alias": write, "must_exist": False}},
        ]
    else:  # its aliases, the write alias too, go with it
        old = [{"remove_index": {"index": now.index}}]
    adds = [{"add": {"index": target, "alias": a}} for a in (now.name, write)]
    client.indices.update_aliases(body={"actions": [*old, *adds]})
    return now.index if now.is_alias else None


def retire(client: OpenSearch, index: str) -> None:
    """Delete a version no alias reads any more."""
    client.indices.delete(index=index, params={"ignore_unavailable": "true"})
