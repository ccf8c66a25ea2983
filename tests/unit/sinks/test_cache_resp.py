"""The Redis follower packs its script calls itself: byte for byte what redis-py would send
for the same call, for any argument (non-ASCII, binary, empty, past redis-py's chunking
cutoff), and the calls carry the keys and arguments the script reads."""

from __future__ import annotations

import hashlib

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.connection import Connection

from pgcdc.core import native
from pgcdc.core.contract import UNAVAILABLE_VALUE_PLACEHOLDER, VersionOrder
from sinks import cache_resp
from sinks.base import Change, OnePerKey
from sinks.cache import _HEAD, _ROWS_PER_CALL, CacheSink, hash_fields
from sinks.cache_script import SCRIPT, SCRIPT_SHA, version_bytes, version_string

pytestmark = pytest.mark.unit

T = "public.orders"


def redis_py(*args: object) -> bytes:
    """What redis-py puts on the wire for a command (its pure-Python packer, no socket)."""
    return b"".join(Connection().pack_command(*args))


@pytest.mark.parametrize(
    "args",
    [
        [b"EVALSHA", b"f" * 40, b"2", b"k", b"v"],
        [b"SET", b"", b""],  # empty strings
        [b"SET", "ünïcødé ✓ 日本語".encode(), "\u0000 nul \U0001f600".encode()],
        [b"SET", b"\r\n$3\r\n*1\r\n", bytes(range(256))],  # RESP framing and every byte
        [b"SET", b"k", b"x" * 6000, b"y" * 6001, b"z" * 100_000],  # around redis-py's cutoff
        [b"HSET", b"k", *[b"f%d" % i for i in range(3200)]],  # many arguments
    ],
)
def test_packs_as_redis_py_does(args: list[bytes]) -> None:
    assert cache_resp.pack(args) == redis_py(*args)
    for n in range(len(args) + 1):  # framed in two runs, cut anywhere
        runs = (args[:n], args[n:])
        parts = [b"".join(cache_resp.BULK % (len(a), a) for a in run) for run in runs]
        assert cache_resp.command(len(args), parts) == redis_py(*args)


# Short arguments, and long ones around redis-py's 6000-byte cutoff (cheap to generate).
LONG = st.tuples(st.binary(min_size=1, max_size=3), st.integers(5990, 6010)).map(
    lambda t: (t[0] * t[1])[: t[1]]
)


@given(st.lists(st.binary(max_size=40) | LONG, max_size=12))
def test_any_arguments_pack_as_redis_py_does(args: list[bytes]) -> None:
    # The command name first: redis-py splits a first argument holding spaces.
    assert cache_resp.pack([b"EVALSHA", *args]) == redis_py(b"EVALSHA", *args)
    # Format characters in an argument stay as they are.
    framed = [cache_resp.BULK % (len(a), a) for a in (b"EVALSHA", b"%s%%d%b", *args)]
    assert cache_resp.command(2 + len(args), framed) == redis_py(b"EVALSHA", b"%s%%d%b", *args)


@given(st.lists(st.text(max_size=20), max_size=8))
def test_text_packs_as_redis_py_encodes_it(args: list[str]) -> None:
    # redis-py encodes text as UTF-8 (strict); the sink hands over the same bytes.
    encoded = [a.encode() for a in args]
    assert cache_resp.pack([b"EVALSHA", *encoded]) == redis_py("EVALSHA", *args)


def test_the_script_is_named_by_its_sha1() -> None:
    assert hashlib.sha1(SCRIPT.encode()).hexdigest() == SCRIPT_SHA
    assert cache_resp.pack([b"EVALSHA", SCRIPT_SHA.encode()]).endswith(_HEAD)


def test_version_bytes_are_the_stored_version() -> None:
    for lsn, order in ((0, 0), (2**64 - 1, 10**10 - 1), (123456789, 42)):
        assert version_bytes(lsn, order) == version_string(VersionOrder(lsn, order)).encode()
    with pytest.raises(ValueError):
        version_bytes(2**64, 0)
    with pytest.raises(ValueError):
        version_bytes(0, 10**10)


@pytest.mark.parametrize("ttl_s", [None, 120])
@pytest.mark.parametrize("value_mode", ["hash", "json"])
def test_a_call_is_what_redis_py_packed_for_the_same_write(
    ttl_s: int | None, value_mode: str
) -> None:
    """The calls the sink sends, against the same calls built as text and packed by
    redis-py (as the sink did before it packed them itself): each row alone, and all of
    them in one call."""
    sink = CacheSink("redis://127.0.0.1:1/0", "cdc", value_mode, ttl_s=ttl_s, tombstone_ttl_s=600)
    ttl = str(ttl_s or 0)
    doc = {"id": 7, "note": 'ünï "q"', "n": None, "big": 2**63 - 1, "f": 1.5}
    partial = Change(T, "7", 2**40, 3, {**doc, "note": UNAVAILABLE_VALUE_PLACEHOLDER})
    cases: list[tuple[Change, str, list[bytes]]]
    if value_mode == "hash":
        # Each column's name, then its value as JSON text: each its own argument.
        def fields(row: dict[str, object]) -> list[bytes]:
            return [x for k, v in row.items() for x in (k.encode(), orjson.dumps(v))]

        kept = {k: v for k, v in doc.items() if k != "note"}
        cases = [(Change(T, "7", 2**40, 3, doc), "h", fields(doc)), (partial, "hp", fields(kept))]
    else:
        cases = [(Change(T, "7", 2**40, 3, doc), "j", [orjson.dumps(doc)])]
        assert sink._write_args(partial) is None  # merged with the held row first
    cases.append((Change(T, "7", 2**40, 3, None), "d", []))
    rows = []
    for change, op, follow in cases:
        args = sink._write_args(change)
        assert args is not None
        keys = [sink.row_key(T, "7").encode(), sink.version_key(T, "7").encode()]
        version = version_string(change.version_order).encode()
        argv = [op.encode(), version, b"*", b"%d" % len(follow), *follow]
        assert sink._pack([(0, change, args)]) == redis_py(
            "EVALSHA", SCRIPT_SHA, 2, *keys, ttl, "600", *argv
        )
        assert sink.script_args([args]) == [*keys, ttl.encode(), b"600", *argv]
        rows.append((0, change, args))
    assert sink._pack(rows) == redis_py(
        "EVALSHA", SCRIPT_SHA, 2 * len(rows), *sink.script_args([a for _, _, a in rows])
    )


@pytest.mark.parametrize("pk", ["42", "a{b}c", "x}y", "{", "}", "{}", "ü", ""])
@pytest.mark.parametrize("prefix", ["cdc", "{app}", "a}b"])
def test_call_keys_are_the_row_and_version_keys(prefix: str, pk: str) -> None:
    sink = CacheSink("redis://127.0.0.1:1/0", prefix)
    assert sink._keys(T, pk) == (sink.row_key(T, pk).encode(), sink.version_key(T, pk).encode())


def test_a_key_that_is_no_text_redis_can_take_fails_alone() -> None:
    # A lone surrogate has no UTF-8 form: that change fails, before anything is sent.
    sink = CacheSink("redis://127.0.0.1:1/0", "cdc")
    [result] = sink.apply([Change(T, "\ud800", 10, 0, {"id": 1})])
    assert result.outcome == "failed" and not result.retryable
    assert "surrogate" in (result.reason or "")


@given(st.lists(st.binary(max_size=40), max_size=12))
def test_framed_arguments_read_back_as_they_were(args: list[bytes]) -> None:
    """What the cluster's calls and the tests take apart: a run of bulk strings, as the
    native path and :func:`sinks.cache.hash_fields` frame a row's hash fields."""
    framed = b"".join(cache_resp.BULK % (len(a), a) for a in args)
    assert cache_resp.unframed(framed) == args


@pytest.mark.parametrize("framed", [b"x", b"$3\r\nab\r\n", b"$2\r\nabc\r\n", b"$\r\n"])
def test_a_run_that_is_not_bulk_strings_is_refused(framed: bytes) -> None:
    with pytest.raises(ValueError):
        cache_resp.unframed(framed)


def _rendered(key: str, lsn: int, order: int, doc: dict[str, object] | None) -> Change:
    """A change as the native path makes it: its document rendered with it."""
    if doc is None:
        return Change(T, key, lsn, order, None)
    rendered = (orjson.dumps(doc), hash_fields(doc), b"")
    return Change(T, key, lsn, order, doc, split=True, rendered=rendered)


@pytest.mark.parametrize("value_mode", ["hash", "json"])
@pytest.mark.parametrize("prefix", ["cdc", "c%dc%%"])
def test_a_rendered_batch_packs_as_the_general_way_packs_it(value_mode: str, prefix: str) -> None:
    """The native path's batch (one change a key, each document rendered with it or a
    delete) is packed straight into each pipeline's bytes, by the native module and by its
    Python twin alike: byte for byte the general way's calls of the same rows, at most
    _ROWS_PER_CALL rows a call, pipelines cut by their rows' bytes."""
    sink = CacheSink("redis://127.0.0.1:1/0", prefix, value_mode, pipeline_max_bytes=40_000)
    changes = OnePerKey(
        _rendered(
            f"k{i}" if i % 3 else f"ü%d{i}",
            2**64 - 1 - i if i % 5 == 0 else i,
            10**10 - 1 if i % 7 == 0 else i,
            None if i % 11 == 0 else {"id": i, "body": "x" * (i % 200), "n": None},
        )
        for i in range(900)
    )
    layout = sink._rendered_layout(T)
    assert layout is not None
    assert (layout.native is None) == (native.module() is None)
    pipelines = sink._rendered_calls(changes)
    assert pipelines is not None and len(pipelines) > 1
    assert sink._python_calls(changes, layout) == pipelines
    rows = 0
    for calls, payload in pipelines:
        groups = [
            [(slot, changes[slot], sink._write_args(changes[slot])) for slot in range(s, e)]
            for s, e in calls
        ]
        assert payload == b"".join(sink._pack(g) for g in groups)  # type: ignore[arg-type]
        assert [s for s, _ in calls] == [rows, *(e for _, e in calls[:-1])]
        assert all(0 < e - s <= _ROWS_PER_CALL for s, e in calls)
        rows = calls[-1][1]
        # The rows' bytes at most the cap; each call's head and TTLs besides them.
        assert len(payload) <= 40_000 + len(calls) * (len(_HEAD) + 40)
    assert rows == len(changes)


def test_a_row_heavier_than_a_pipeline_is_a_pipeline_of_its_own() -> None:
    sink = CacheSink("redis://127.0.0.1:1/0", "cdc", pipeline_max_bytes=1024)
    # Small rows and rows of more than the cap, one after the other: each row alone.
    changes = OnePerKey(_rendered(str(i), 10, i, {"b": "x" * 1100 * (i % 2)}) for i in range(6))
    layout = sink._rendered_layout(T)
    assert layout is not None
    pipelines = sink._rendered_calls(changes)
    assert pipelines is not None and pipelines == sink._python_calls(changes, layout)
    assert [calls for calls, _ in pipelines] == [[(i, i + 1)] for i in range(6)]


@pytest.mark.parametrize(
    "batch",
    [
        [Change(T, "1", 10, 0, {"id": 1})],  # a list: the general way's
        OnePerKey([Change(T, "1", 10, 0, {"id": 1})]),  # not rendered
        OnePerKey([_rendered("a{b}", 10, 0, {"id": 1})]),  # a brace: tagged otherwise
        OnePerKey([_rendered("\ud800", 10, 0, {"id": 1})]),  # no UTF-8 form
        OnePerKey([_rendered("1", 10, 0, {"id": 1}), Change("public.b", "1", 10, 1, None)]),
        OnePerKey([Change("public:odd.t", "1", 10, 0, None)]),  # no table id
        OnePerKey([Change(T, "1", 2**64, 0, None)]),  # past the version's width
        OnePerKey([Change(T, "1", 10, 10**10, None)]),
        OnePerKey(
            [
                Change(
                    T,
                    "1",
                    10,
                    0,
                    {"id": 1, "b": UNAVAILABLE_VALUE_PLACEHOLDER},
                    frozenset({"b"}),
                    rendered=(b"", b"", b""),
                )
            ]
        ),  # unchanged columns
    ],
)
def test_any_other_batch_is_left_to_the_general_way(batch: list[Change]) -> None:
    sink = CacheSink("redis://127.0.0.1:1/0", "cdc")
    if type(batch) is OnePerKey:
        assert sink._rendered_calls(batch) is None
        layout = sink._rendered_layout(batch[0].table)
        assert layout is None or sink._python_calls(batch, layout) is None
    assert sink._apply_rendered(batch) is None  # nothing sent (no Redis listens there)


def test_a_prefix_with_a_brace_is_left_to_the_general_way() -> None:
    sink = CacheSink("redis://127.0.0.1:1/0", "{app}")
    assert sink._rendered_calls(OnePerKey([_rendered("1", 10, 0, {"id": 1})])) is None
