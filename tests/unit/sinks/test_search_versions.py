"""The search follower's external versions: the commit LSN with ``external_gte``, exact at
any LSN below 2**63 and any order inside a transaction (was: LSN << 16 | min(order, 0xFFFF),
which collided past 65,535 changes and overflowed past LSN 2**47)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgcdc.core.errors import SinkError
from sinks.base import Change
from sinks.search_requests import MAX_EXTERNAL_VERSION, bulk_action, check_versionable

pytestmark = pytest.mark.unit


def _meta(kind: str, change: Change) -> dict[str, object]:
    line = bulk_action(kind, "cdc-public.t", change)
    assert line.endswith(b"\n")
    meta: dict[str, dict[str, object]] = orjson.loads(line)
    return meta[kind]


@given(
    st.integers(min_value=0, max_value=MAX_EXTERNAL_VERSION),
    st.integers(min_value=0, max_value=2**40),
)
def test_the_version_is_the_commit_lsn_with_external_gte(lsn: int, order: int) -> None:
    for kind in ("index", "delete"):  # deletes carry the LSN too
        change = Change("public.t", "1", lsn, order, None if kind == "delete" else {"id": 1})
        check_versionable(change)
        meta = _meta(kind, change)
        assert meta == {
            "_index": "cdc-public.t",
            "_id": "1",
            "version": lsn,
            "version_type": "external_gte",
        }


def test_lsns_past_the_old_packing_limits_are_exact() -> None:
    # 2**47 and beyond overflowed the packed version; orders past 65535 were clamped.
    for lsn in (2**47, 2**47 + 1, 2**62, MAX_EXTERNAL_VERSION):
        assert _meta("index", Change("public.t", "1", lsn, 70_000, {}))["version"] == lsn


def test_an_lsn_beyond_the_largest_external_version_fails_fast() -> None:
    with pytest.raises(SinkError, match=r"2\*\*63-1") as e:
        check_versionable(Change("public.t", "7", MAX_EXTERNAL_VERSION + 1, 0, {}))
    assert "public.t/7" in str(e.value)


@given(
    st.sampled_from(["index", "delete"]),
    st.text(min_size=1),
    st.text(min_size=1),
    st.integers(min_value=0, max_value=MAX_EXTERNAL_VERSION),
)
def test_the_action_line_is_the_json_of_its_meta(kind: str, index: str, key: str, lsn: int) -> None:
    meta = {kind: {"_index": index, "_id": key, "version": lsn, "version_type": "external_gte"}}
    line = bulk_action(kind, index, Change("public.t", key, lsn, 0, None))
    assert line == orjson.dumps(meta) + b"\n"
