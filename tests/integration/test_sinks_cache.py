"""The Redis follower's writer against the real Redis: versions, tombstones, TOAST, watermarks."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
import redis

from pgcdc.core.contract import UNAVAILABLE_VALUE_PLACEHOLDER
from pgcdc.core.errors import RetryableSinkError
from sinks import cache_resp
from sinks.base import Change, OnePerKey
from sinks.cache import CacheSink, hash_fields
from sinks.cache_script import SCRIPT_SHA, version_bytes
from tests.conftest import Endpoints

pytestmark = pytest.mark.integration

T = "public.orders"


@pytest.fixture(params=["hash", "json"])
def sink(
    request: pytest.FixtureRequest, endpoints: Endpoints, key_prefix: str
) -> Iterator[CacheSink]:
    s = CacheSink(endpoints.redis_url, key_prefix, value_mode=request.param, tombstone_ttl_s=600)
    yield s
    s.close()


@pytest.fixture
def raw(endpoints: Endpoints) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(endpoints.redis_url)
    yield r
    r.close()


def _outcomes(results: list[Any]) -> list[str]:
    return [r.outcome for r in results]


def _snapshot(raw: redis.Redis, prefix: str) -> dict[bytes, Any]:
    """Every key under the prefix with its type and contents."""
    out: dict[bytes, Any] = {}
    for k in sorted(raw.scan_iter(match=f"{prefix}*")):
        kind = raw.type(k)
        out[k] = (kind, raw.hgetall(k) if kind == b"hash" else raw.get(k))
    return out


def test_creates_updates_and_deletes(sink: CacheSink) -> None:
    results = sink.apply(
        [
            Change(
                T, "1", 100, 0, {"id": 1, "status": "new", "total": 9007199254740993, "note": None}
            ),
            Change(T, "2", 100, 1, {"id": 2, "status": "new", "total": 1.5, "note": "x"}),
        ]
    )
    assert _outcomes(results) == ["applied", "applied"]
    # Types, NULL and an integer beyond 2**53 round-trip exactly.
    assert sink.read_row(T, "1") == {
        "id": 1,
        "status": "new",
        "total": 9007199254740993,
        "note": None,
    }
    assert sink.read_row(T, "2") == {"id": 2, "status": "new", "total": 1.5, "note": "x"}

    assert _outcomes(
        sink.apply([Change(T, "1", 200, 0, {"id": 1, "status": "paid", "total": 3, "note": None})])
    ) == ["applied"]
    assert sink.read_row(T, "1") == {"id": 1, "status": "paid", "total": 3, "note": None}
    assert sink.read_version(T, "1") == (200, 0)

    assert _outcomes(sink.apply([Change(T, "2", 300, 0, None)])) == ["applied"]
    assert sink.read_row(T, "2") is None
    assert sink.read_version(T, "2") == (300, 0)  # the tombstone


def test_stale_write_is_skipped_and_changes_nothing(sink: CacheSink, raw: redis.Redis) -> None:
    sink.apply([Change(T, "1", 0x2_0000_0000, 5, {"id": 1, "status": "newer"})])
    before = _snapshot(raw, sink.key_prefix)
    # Same LSN, lower ordinal; then a lower LSN with a higher ordinal.
    results = sink.apply(
        [Change(T, "1", 0x2_0000_0000, 4, {"id": 1, "status": "older"})]
    ) + sink.apply([Change(T, "1", 0x1_FFFF_FFFF, 99, {"id": 1, "status": "oldest"})])
    assert _outcomes(results) == ["skipped", "skipped"]
    assert all(r.reason for r in results)
    assert _snapshot(raw, sink.key_prefix) == before


def test_versions_beyond_53_bits_compare_exactly(sink: CacheSink) -> None:
    # Two LSNs that are equal as doubles: only an exact comparison tells them apart.
    low, high = 2**60, 2**60 + 1
    assert float(low) == float(high)
    assert _outcomes(sink.apply([Change(T, "9", high, 0, {"v": "high"})])) == ["applied"]
    assert _outcomes(sink.apply([Change(T, "9", low, 0, {"v": "low"})])) == ["skipped"]
    assert sink.read_row(T, "9") == {"v": "high"}


def test_any_lsn_and_any_order_compare_exactly(sink: CacheSink) -> None:
    """LSNs from 2**47 (where the search follower's old packed version overflowed) up to
    2**64-1, and orders past 2**16 (where it was clamped), as exact pairs."""
    lsns = [2**47 - 1, 2**47, 2**47 + 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]
    for lsn in lsns:
        applied = sink.apply([Change(T, "8", lsn, 2**16, {"v": str(lsn)})])
        assert _outcomes(applied) == ["applied"], lsn
        assert sink.read_version(T, "8") == (lsn, 2**16)
        # The same transaction, a later order: applied; an earlier one: refused.
        later = {"v": f"later {lsn}"}
        assert _outcomes(sink.apply([Change(T, "8", lsn, 2**16 + 1, later)])) == ["applied"]
        assert _outcomes(sink.apply([Change(T, "8", lsn, 2**16 - 1, None)])) == ["skipped"]
        assert sink.read_row(T, "8") == later
    # A delete then a re-insert of the key, orders past 65535 in one transaction.
    last = lsns[-1]
    assert _outcomes(sink.apply([Change(T, "8", last, 10**9, None)])) == ["applied"]
    assert sink.read_row(T, "8") is None
    assert _outcomes(sink.apply([Change(T, "8", last, 10**9 + 1, {"v": "back"})])) == ["applied"]
    assert sink.read_row(T, "8") == {"v": "back"}
    assert sink.read_version(T, "8") == (last, 10**9 + 1)


def test_replaying_a_batch_skips_everything(sink: CacheSink, raw: redis.Redis) -> None:
    batch = [Change(T, str(i), 500, i, {"id": i, "n": i * 2}) for i in range(50)]
    batch.append(Change(T, "7", 501, 0, None))
    first = sink.apply(batch)
    assert _outcomes(first).count("applied") == 50  # key 7's insert is superseded by its delete
    before = _snapshot(raw, sink.key_prefix)
    again = sink.apply(batch)
    assert set(_outcomes(again)) == {"skipped"}
    assert _snapshot(raw, sink.key_prefix) == before
    assert sink.read_row(T, "7") is None
    assert sink.read_row(T, "8") == {"id": 8, "n": 16}


def test_same_key_twice_in_a_batch_the_higher_version_wins(sink: CacheSink) -> None:
    results = sink.apply([Change(T, "1", 20, 0, {"v": "new"}), Change(T, "1", 10, 0, {"v": "old"})])
    assert _outcomes(results) == ["applied", "skipped"]
    assert sink.read_row(T, "1") == {"v": "new"}


def test_delete_then_late_older_insert_stays_deleted(sink: CacheSink, raw: redis.Redis) -> None:
    sink.apply([Change(T, "1", 10, 0, {"id": 1})])
    assert _outcomes(sink.apply([Change(T, "1", 30, 0, None)])) == ["applied"]
    # The insert was committed before the delete but arrives after it.
    assert _outcomes(sink.apply([Change(T, "1", 20, 0, {"id": 1, "late": True})])) == ["skipped"]
    assert sink.read_row(T, "1") is None
    ttl = raw.ttl(sink.version_key(T, "1"))
    assert 0 < ttl <= 600  # the tombstone expires on its own
    # A newer insert (the key re-used) does come back, and its version loses the TTL.
    assert _outcomes(sink.apply([Change(T, "1", 40, 0, {"id": 1, "again": True})])) == ["applied"]
    assert sink.read_row(T, "1") == {"id": 1, "again": True}
    assert raw.ttl(sink.version_key(T, "1")) == -1


def test_delete_of_a_row_never_seen_leaves_a_tombstone(sink: CacheSink) -> None:
    assert _outcomes(sink.apply([Change(T, "5", 50, 0, None)])) == ["applied"]
    assert _outcomes(sink.apply([Change(T, "5", 40, 0, {"id": 5})])) == ["skipped"]
    assert sink.read_row(T, "5") is None


def test_unchanged_toast_keeps_the_held_value(sink: CacheSink, raw: redis.Redis) -> None:
    body = "b" * 100_000
    sink.apply([Change(T, "1", 10, 0, {"id": 1, "body": body, "n": 1, "big": 2**62 + 1})])
    update = Change(
        T,
        "1",
        11,
        0,
        {"id": 1, "body": UNAVAILABLE_VALUE_PLACEHOLDER, "n": 2, "big": 2**62 + 1},
        frozenset({"body"}),
    )
    assert _outcomes(sink.apply([update])) == ["applied"]
    assert sink.read_row(T, "1") == {"id": 1, "body": body, "n": 2, "big": 2**62 + 1}
    for _, (_, contents) in _snapshot(raw, sink.key_prefix).items():
        assert UNAVAILABLE_VALUE_PLACEHOLDER.encode() not in repr(contents).encode()


def test_unchanged_toast_without_a_held_row_leaves_the_column_out(
    sink: CacheSink, raw: redis.Redis
) -> None:
    update = Change(
        T, "3", 11, 0, {"id": 3, "body": UNAVAILABLE_VALUE_PLACEHOLDER}, frozenset({"body"})
    )
    (result,) = sink.apply([update])
    assert result.outcome == "applied"
    assert result.reason and "body" in result.reason
    assert sink.read_row(T, "3") == {"id": 3}
    assert all(
        UNAVAILABLE_VALUE_PLACEHOLDER.encode() not in repr(v).encode()
        for v in _snapshot(raw, sink.key_prefix).values()
    )


def test_json_merge_refuses_to_write_over_a_concurrent_write(
    endpoints: Endpoints, key_prefix: str
) -> None:
    """The JSON merge writes only if the held version is still the one it read."""
    sink = CacheSink(endpoints.redis_url, key_prefix, value_mode="json")
    try:
        sink.apply([Change(T, "1", 10, 0, {"id": 1, "body": "old", "n": 0})])
        # A merge built on "no row held" ('') while version 10 is held: another writer
        # landed between the read and the write. The script must answer "conflict" (3),
        # which makes apply() read and merge again, rather than write stale data.
        late = Change(T, "1", 12, 0, {"id": 1})
        row = cache_resp.BULK % (8, b'{"id":1}')
        stale_merge = sink._args(late, b"jp", version_bytes(12, 0), 1, row, expected=b"")
        reply = sink.client.evalsha(sink._script_sha(), 2, *sink.script_args([stale_merge]))
        assert reply == [b"3", []]
        assert sink.read_row(T, "1") == {"id": 1, "body": "old", "n": 0}
    finally:
        sink.close()


def test_a_refused_write_fails_alone(sink: CacheSink, raw: redis.Redis) -> None:
    # Something else put a list where a row belongs: a partial update of it is refused.
    raw.rpush(sink.row_key(T, "bad"), "x")
    partial = {"id": "bad", "body": UNAVAILABLE_VALUE_PLACEHOLDER}
    results = sink.apply(
        [
            Change(T, "ok", 10, 0, {"id": "ok"}),
            Change(T, "bad", 10, 1, partial, frozenset({"body"})),
            Change(T, "nojson", 10, 2, {"id": object()}),
            Change("public:odd.t", "1", 10, 3, {"id": 1}),
        ]
    )
    assert _outcomes(results) == ["applied", "failed", "failed", "failed"]
    assert sink.read_row(T, "ok") == {"id": "ok"}
    assert results[1].reason and "WRONGTYPE" in results[1].reason
    assert "not JSON" in (results[2].reason or "") or "serializable" in (results[2].reason or "")
    assert "<schema>.<table>" in (results[3].reason or "")
    assert not any(r.retryable for r in results)
    assert raw.lrange(sink.row_key(T, "bad"), 0, -1) == [b"x"]


def test_each_row_of_a_many_row_call_has_its_own_outcome(sink: CacheSink, raw: redis.Redis) -> None:
    # Rows go to the script _ROWS_PER_CALL a call: a refused row and a stale one in the
    # second call fail and skip alone, and every other row of both calls is applied.
    raw.rpush(sink.row_key(T, "bad"), "x")
    sink.apply([Change(T, "newer", 50, 0, {"id": "newer"})])
    changes = [Change(T, str(i), 10, i, {"id": i}) for i in range(450)]
    changes[300] = Change(
        T, "bad", 10, 300, {"id": "bad", "body": UNAVAILABLE_VALUE_PLACEHOLDER}, frozenset({"body"})
    )
    changes[301] = Change(T, "newer", 10, 301, {"id": "stale"})
    results = sink.apply(changes)
    expected = ["applied"] * 450
    expected[300:302] = ["failed", "skipped"]
    assert _outcomes(results) == expected
    assert results[300].reason and "WRONGTYPE" in results[300].reason
    assert [results[i].key for i in (0, 300, 301, 449)] == ["0", "bad", "newer", "449"]
    assert sink.read_row(T, "newer") == {"id": "newer"}
    assert all(sink.read_row(T, str(i)) == {"id": i} for i in (0, 199, 200, 299, 302, 449))


def test_ttl_applies_to_row_and_version(
    endpoints: Endpoints, key_prefix: str, raw: redis.Redis
) -> None:
    sink = CacheSink(endpoints.redis_url, key_prefix, ttl_s=120)
    try:
        sink.apply([Change(T, "1", 10, 0, {"id": 1})])
        assert 0 < raw.ttl(sink.row_key(T, "1")) <= 120
        assert 0 < raw.ttl(sink.version_key(T, "1")) <= 120
    finally:
        sink.close()


def test_watermark_only_increases(sink: CacheSink) -> None:
    assert sink.read_watermark("job") is None
    sink.record_watermark("job", 2**60 + 1)
    sink.record_watermark("job", 2**60)  # equal as a double, smaller exactly
    assert sink.read_watermark("job") == 2**60 + 1
    sink.record_watermark("job", 2**61)
    assert sink.read_watermark("job") == 2**61
    assert sink.read_watermark("other") is None


def test_script_is_reloaded_after_script_flush(
    endpoints: Endpoints, key_prefix: str, raw: redis.Redis
) -> None:
    """Redis lost the script (SCRIPT FLUSH, a restart): the calls answered NOSCRIPT are sent
    again after a reload, in a batch cut into several pipelines, and the watermark's too."""
    sink = CacheSink(endpoints.redis_url, key_prefix, pipeline_max_bytes=1024)
    try:
        sink.apply([Change(T, "0", 10, 0, {"id": 0})])
        assert sink.script_loads == 1
        reloads = 0
        # Another client of the shared server may load the same script (same SHA-1) between
        # the flush and the apply: try again until this sink met NOSCRIPT itself.
        for attempt in range(1, 6):
            loads = sink.script_loads
            raw.script_flush()
            lsn = 100 * attempt
            changes = [Change(T, str(i), lsn, i, {"id": i, "body": "b" * 100}) for i in range(30)]
            assert set(_outcomes(sink.apply(changes))) == {"applied"}
            assert all(sink.read_version(T, str(i)) == (lsn, i) for i in range(30))
            reloads += sink.script_loads - loads
            if reloads:
                break
        assert reloads == 1  # once for the batch: the later pipelines found it loaded
        assert raw.script_exists(SCRIPT_SHA) == [True]
        for attempt in range(1, 6):
            loads = sink.script_loads
            raw.script_flush()
            sink.record_watermark("job", attempt)
            assert sink.read_watermark("job") == attempt
            if sink.script_loads > loads:
                break
        assert sink.script_loads == loads + 1
    finally:
        sink.close()


class _CuttingProxy:
    """Forwards to Redis, but drops a connection (both ends) as soon as it carries an
    EVALSHA, ``cuts`` times: the sink's pipeline is lost after it was sent."""

    def __init__(self, target: tuple[str, int], cuts: int) -> None:
        self.target = target
        self.cuts_left = cuts
        self.cut = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._listener.getsockname()[1]}/0"
        threading.Thread(target=self._accept, name="cutting-proxy", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.connections += 1
            for src, dst, upstream in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pipe, args=(src, dst, upstream), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while data := src.recv(65536):
                if upstream and b"EVALSHA" in data:
                    with self._lock:
                        cut = self.cuts_left > 0
                        if cut:
                            self.cuts_left -= 1
                            self.cut += 1
                    if cut:
                        break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def close(self) -> None:
        self._listener.close()


def _redis_address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 6379


def test_a_pipeline_lost_on_the_wire_is_sent_again(endpoints: Endpoints, key_prefix: str) -> None:
    proxy = _CuttingProxy(_redis_address(endpoints.redis_url), cuts=1)
    sink = CacheSink(proxy.url, key_prefix, retries=3, backoff_s=0.01)
    try:
        changes = [Change(T, str(i), 10, i, {"id": i}) for i in range(50)]
        assert set(_outcomes(sink.apply(changes))) == {"applied"}
        assert proxy.cut == 1 and proxy.connections == 2  # cut once, then reconnected
        assert sink.read_row(T, "49") == {"id": 49}
    finally:
        sink.close()
        proxy.close()


def test_a_pipeline_lost_every_time_is_retryable(endpoints: Endpoints, key_prefix: str) -> None:
    proxy = _CuttingProxy(_redis_address(endpoints.redis_url), cuts=100)
    sink = CacheSink(proxy.url, key_prefix, retries=2, backoff_s=0.01)
    direct = CacheSink(endpoints.redis_url, key_prefix)
    try:
        with pytest.raises(RetryableSinkError, match="unreachable"):
            sink.apply([Change(T, "1", 10, 0, {"id": 1})])
        assert proxy.cut == 3  # the first send and two retries
        assert direct.read_version(T, "1") is None
    finally:
        sink.close()
        direct.close()
        proxy.close()


def test_an_unreachable_redis_raises_retryable() -> None:
    # Nothing listens on port 1: the client retries with backoff, then the sink says so.
    sink = CacheSink("redis://127.0.0.1:1/0", "cdc", retries=2, backoff_s=0.01)
    try:
        with pytest.raises(RetryableSinkError):
            sink.apply([Change(T, "1", 10, 0, {"id": 1})])
        with pytest.raises(RetryableSinkError):
            sink.read_watermark("job")
    finally:
        sink.close()


class _RacingSink(CacheSink):
    """Lets another writer change the row right after the JSON merge has read it, once."""

    def __init__(self, *args: Any, other: CacheSink, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.other = other
        self.raced = False

    def _execute(self, pipe: Any, raise_on_error: bool = True) -> list[Any]:
        replies = super()._execute(pipe, raise_on_error)
        is_merge_read = all(r is None or isinstance(r, bytes) for r in replies)
        if is_merge_read and not self.raced:
            self.raced = True
            self.other.apply([Change(T, "1", 15, 0, {"id": 1, "body": "racer", "n": 15})])
        return replies


def test_json_merge_is_redone_when_another_write_lands_in_between(
    endpoints: Endpoints, key_prefix: str
) -> None:
    other = CacheSink(endpoints.redis_url, key_prefix, value_mode="json")
    sink = _RacingSink(endpoints.redis_url, key_prefix, value_mode="json", other=other)
    try:
        sink.apply([Change(T, "1", 10, 0, {"id": 1, "body": "first", "n": 10})])
        partial = Change(
            T,
            "1",
            20,
            0,
            {"id": 1, "body": UNAVAILABLE_VALUE_PLACEHOLDER, "n": 20},
            frozenset({"body"}),
        )
        assert _outcomes(sink.apply([partial])) == ["applied"]
        assert sink.raced
        # The merge used the racer's body (version 15), not the one it first read (10).
        assert sink.read_row(T, "1") == {"id": 1, "body": "racer", "n": 20}
    finally:
        sink.close()
        other.close()


def test_awkward_names_and_values_round_trip(sink: CacheSink) -> None:
    doc = {
        'quote"d': 'say "hi"\n',
        "ünïcødé ✓": "日本語 \u0000 nul",
        "": "empty column name",
        "nul\u0000in a name": "\u0000",
        "nested": {"a": [1, 2.5, None, True]},
        "max_i64": 2**63 - 1,
    }
    assert _outcomes(sink.apply([Change(T, "k:with:colons", 10, 0, doc)])) == ["applied"]
    assert sink.read_row(T, "k:with:colons") == doc


def test_a_row_without_columns_holds_no_fields(sink: CacheSink) -> None:
    sink.apply([Change(T, "empty", 10, 0, {"id": 1})])
    assert _outcomes(sink.apply([Change(T, "empty", 11, 0, {})])) == ["applied"]
    # A hash of no fields is no key; a JSON row is the empty object.
    assert sink.read_row(T, "empty") == (None if sink.value_mode == "hash" else {})
    assert sink.read_version(T, "empty") == (11, 0)


def test_the_widest_postgresql_row(sink: CacheSink) -> None:
    # PostgreSQL allows 1600 columns; the script unpacks them all into one HSET.
    doc = {f"c{i}": i for i in range(1600)}
    assert _outcomes(sink.apply([Change(T, "wide", 10, 0, doc)])) == ["applied"]
    assert sink.read_row(T, "wide") == doc


def test_pipelines_are_sized_by_bytes(
    endpoints: Endpoints, key_prefix: str, raw: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = CacheSink(endpoints.redis_url, key_prefix, pipeline_max_bytes=8192)
    sizes: list[int] = []
    send = sink._run_pipeline

    def counted(calls: Any, outcomes: Any) -> Any:
        sizes.append(sum(len(a) for c in calls for a in c[2]))
        return send(calls, outcomes)

    monkeypatch.setattr(sink, "_run_pipeline", counted)
    try:
        changes = [
            Change("public.items", str(i), 10 + i, 0, {"body": "z" * 1000}) for i in range(60)
        ]
        assert set(_outcomes(sink.apply(changes))) == {"applied"}
    finally:
        sink.close()
    assert len(sizes) >= 60 * 1000 // 8192 and max(sizes) <= 8192
    assert orjson.loads(raw.hget(f"{key_prefix}:public.items:59", "body")) == "z" * 1000


def test_rows_of_one_call_with_other_columns_hold_their_own(
    sink: CacheSink, raw: redis.Redis, key_prefix: str
) -> None:
    """One script call carries rows whose column lists differ (two tables, a narrower row,
    names in another order): the script decodes each list of names once a call and each
    row holds exactly its own columns, a row written over a wider one included."""
    other = "public.items"
    first = [
        Change(T, "1", 100, 0, {"id": 1, "status": "new", "note": "a"}),
        Change(other, "1", 100, 1, {"sku": "x", "qty": 2}),
        Change(T, "2", 100, 2, {"id": 2, "status": "new", "note": "b"}),
        Change(T, "3", 100, 3, {"note": "c", "id": 3}),
        Change(other, "2", 100, 4, {"sku": "y", "qty": 3}),
    ]
    assert _outcomes(sink.apply(first)) == ["applied"] * 5
    assert sink.read_row(T, "1") == {"id": 1, "status": "new", "note": "a"}
    assert sink.read_row(T, "2") == {"id": 2, "status": "new", "note": "b"}
    assert sink.read_row(T, "3") == {"note": "c", "id": 3}
    assert sink.read_row(other, "1") == {"sku": "x", "qty": 2}
    assert sink.read_row(other, "2") == {"sku": "y", "qty": 3}
    narrower = [
        Change(T, "1", 200, 0, {"id": 1}),
        Change(T, "2", 200, 1, {"id": 2, "status": "paid", "note": "b"}),
    ]
    assert _outcomes(sink.apply(narrower)) == ["applied"] * 2
    assert sink.read_row(T, "1") == {"id": 1}  # the columns it no longer has are gone
    assert sink.read_row(T, "2") == {"id": 2, "status": "paid", "note": "b"}
    if sink.value_mode == "hash":
        assert raw.hkeys(sink.row_key(T, "1")) == [b"id"]


def _rendered(key: str, lsn: int, order: int, doc: dict[str, Any] | None) -> Change:
    """A change as the native path makes it: its document rendered with it."""
    if doc is None:
        return Change(T, key, lsn, order, None)
    rendered = (orjson.dumps(doc), hash_fields(doc), b"")
    return Change(T, key, lsn, order, doc, split=True, rendered=rendered)


def _held(raw: redis.Redis, prefix: str) -> dict[bytes, Any]:
    """:func:`_snapshot` of the keys ``<prefix>:…``, the prefix in their names as ``P``."""
    mine = prefix.encode()
    return {
        k.replace(mine, b"P"): v
        for k, v in _snapshot(raw, prefix).items()
        if k.startswith(mine + b":")
    }


def test_a_rendered_batch_is_written_as_the_general_way_writes_it(
    sink: CacheSink, raw: redis.Redis, key_prefix: str, endpoints: Endpoints
) -> None:
    """The native path's batches (one change a key, each document rendered with it or a
    delete) are packed a row a bytes format and their results made with no bookkeeping a
    change: the same results and the same keys as the same changes written the general
    way, over several calls and pipelines, stale and repeated writes skipped."""
    general = CacheSink(
        endpoints.redis_url, f"{key_prefix}-general", sink.value_mode, tombstone_ttl_s=600
    )
    try:
        for s in (sink, general):
            s.pipeline_max_bytes = 20_000
        rows: dict[str, dict[str, Any] | None] = {
            str(i): {"id": i, "title": f"row {i} \u00e9", "n": i / 3, "none": None}
            for i in range(450)
        }
        rows["empty"] = {}
        first = [_rendered(k, 100, i, doc) for i, (k, doc) in enumerate(rows.items())]
        then = [_rendered("3", 200, 0, None), _rendered("never", 200, 1, None)]
        then += [_rendered("4", 200, 2, {"id": 4}), _rendered("5", 50, 3, {"id": "stale"})]
        for batch in (first, then, then):
            got = sink.apply(OnePerKey(batch))
            assert got == general.apply(list(batch))
            assert {r.outcome for r in got} <= {"applied", "skipped"}
        assert _outcomes(got) == ["skipped"] * 4  # the same batch again
        assert (sink.rendered_batches, general.rendered_batches) == (3, 0)
        held = _held(raw, key_prefix)
        assert len(held) > 2 * 445  # the rows and their version keys
        assert held == _held(raw, f"{key_prefix}-general")
        assert sink.read_row(T, "4") == {"id": 4} and sink.read_row(T, "3") is None
        assert sink.read_row(T, "5") == rows["5"]
    finally:
        general.close()


def test_a_refused_row_of_a_rendered_batch_fails_alone(sink: CacheSink, raw: redis.Redis) -> None:
    """A row Redis refuses in a rendered batch (its version key made another type by
    something else): its call is settled the general way from its reply, and that row alone
    fails; every other row of that call and the others is applied."""
    raw.rpush(sink.version_key(T, "250"), "x")
    batch = [_rendered(str(i), 10, i, {"id": i}) for i in range(450)]
    results = sink.apply(OnePerKey(batch))
    assert sink.rendered_batches == 1
    expected = ["applied"] * 450
    expected[250] = "failed"
    assert _outcomes(results) == expected
    assert results[250].reason and "WRONGTYPE" in results[250].reason
    assert not results[250].retryable and results[250].key == "250"
    assert all(sink.read_row(T, str(i)) == {"id": i} for i in (0, 199, 200, 249, 251, 449))
    assert raw.lrange(sink.version_key(T, "250"), 0, -1) == [b"x"]


def test_a_rendered_batch_loads_the_script_again_after_a_flush(
    sink: CacheSink, raw: redis.Redis
) -> None:
    """Redis lost the script: a rendered batch's calls answered NOSCRIPT are sent again
    the general way after a reload, and every row is applied."""
    sink.apply(OnePerKey([_rendered("0", 10, 0, {"id": 0})]))
    reloads = 0
    # Another client of the shared server may load the same script between the flush and
    # the apply: try again until this sink met NOSCRIPT itself.
    for attempt in range(1, 6):
        loads = sink.script_loads
        raw.script_flush()
        lsn = 100 * attempt
        batch = [_rendered(str(i), lsn, i, {"id": i, "at": attempt}) for i in range(300)]
        assert _outcomes(sink.apply(OnePerKey(batch))) == ["applied"] * 300
        assert all(sink.read_version(T, str(i)) == (lsn, i) for i in (0, 199, 200, 299))
        reloads += sink.script_loads - loads
        if reloads:
            break
    assert reloads == 1
    assert sink.rendered_batches == 1 + attempt
